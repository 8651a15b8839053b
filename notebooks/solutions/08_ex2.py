# The halo reaches into at least one chunk, and its chunks may be at most a quarter of a block: 4 chunks at least.
my_fewest_block_chunks = 4
# Blocks of 8 chunks: short enough for 32 of them in the training period, twice the fewest the halo allows.
my_windows = zt.Windows(history=2, lead=4, static=("orography",), block_chunks=8)
