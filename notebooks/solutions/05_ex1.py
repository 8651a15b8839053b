# ROWS rows in chunks of chunk_rows: ceil(ROWS / chunk_rows) chunks, of which round(0.3 x chunks) validate.
# The fitting windows start before the boundary; their last rows run span - 1 = 2 rows past it.
n_chunks = -(-ROWS // chunk_rows)
boundary = (n_chunks - round(0.3 * n_chunks)) * chunk_rows
my_fit_range = (0, boundary + 2)
my_val_range = (boundary + 2, ROWS)
