# The floor: 8 MiB on object storage, in whole rows, rounded up.
floor_rows = -(-MIN_CHUNK_BYTES["object"] // row_bytes)
# The readers' ceiling: 2 readers x 8 chunks each, whole chunks of the rows one epoch reads.
longest = ROWS // (2 * 8)
# A buffer of 8 chunks of 8 MiB fits the default 1 GiB: only these two can disagree, and the ceiling wins.
my_prediction = min(floor_rows, longest)
