# Name every axis: 64 rows along time, and -1 ("whole") for the axis the archive chunks by one variable.
# lat and lon are already whole in the archive; naming them -1 too does no harm.
my_chunking = {"time": 64, "variable": -1}
