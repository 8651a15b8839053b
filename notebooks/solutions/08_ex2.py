# Shorter blocks give every reader more of them: block_chunks sets how many chunks a block holds. 32 blocks in
# the training period's starts need blocks of at most advice.samples // 32 rows; the halo ceiling needs a block
# of at least 4 times the chunks the halo reaches into. 8 chunks leave room for both at every size.
my_windows = zt.Windows(history=2, lead=4, static=("orography",), block_chunks=8)
