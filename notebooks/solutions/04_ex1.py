# Three runs of 10 = 4 + 3 + 3 numbers: the first one is the longer (10 % 3 = 1)
runs = [[f"w{w}:{i}" for i in run] for w, run in enumerate([range(0, 4), range(4, 7), range(7, 10)])]
# the loader takes one item from each worker in turn; worker 0's last item comes alone, the others have run out
my_prediction = [run[k] for k in range(4) for run in runs if k < len(run)]
