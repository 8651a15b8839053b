# With windows the pieces are blocks, and a block holds at least 20 halos of rows whatever the chunk length:
# 20 x 5 = 100 rows. The training period's windows make at most (split - halo) // 100 whole blocks; 2 GPUs x
# 2 workers need 4 readers x 8 blocks each.
halo = WINDOWS.span - 1
my_prediction = (split - halo) // (20 * halo) >= 2 * 2 * 8
