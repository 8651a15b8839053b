# write the body of share, and your prediction for share(FIT_ROWS, 3, BATCH) as a tuple of two ints
def share(rows, ranks, batch):
    batches = rows // (ranks * batch)  # one step of all the ranks uses ranks x batch rows
    return batches, rows - batches * ranks * batch  # the rest is left out of the epoch


my_prediction = (10, 64)  # 1024 rows // (3 x 32) = 10 batches each, and 1024 - 960 = 64 rows left out
