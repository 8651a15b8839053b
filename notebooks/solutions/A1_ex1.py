# write your predictions: True or False, and an int (or an expression of ROWS and BATCH)
reference_epoch_finishes = False  # whole chunks dealt to ranks: the rank holding the short chunk has fewer rows
zarrtorch_batches_per_rank = ROWS // (3 * BATCH)  # one step of 3 ranks uses 3 x BATCH rows
