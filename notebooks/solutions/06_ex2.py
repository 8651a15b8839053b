# write your predictions as ints: the batches each of 4 ranks trains after the resume, and the rows left out
remaining = FIT_ROWS - state["batches_seen"] * state["world_size"] * BATCH  # rows the 2 old ranks did not train
batches_each = remaining // (4 * BATCH)
left_out = remaining - batches_each * 4 * BATCH
