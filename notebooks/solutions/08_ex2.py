# Shorter blocks give every reader more of them: block_chunks sets how many chunks a block holds. Too few,
# and the halo reaches into more than a quarter of a block; 8 chunks leave room for both at every size.
my_windows = zt.Windows(history=2, lead=4, static=("orography",), block_chunks=8)
