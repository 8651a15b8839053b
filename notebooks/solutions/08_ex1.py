# With windows the pieces are blocks, and a block holds 20 times the chunks the halo (5 rows) reaches into: at
# least 20 x 5 = 100 rows (chunks of 1 or 5 rows), more at other lengths. So the training period's windows make
# at most (split - halo) // 100 whole blocks; 2 GPUs x 2 workers need 4 readers x 8 blocks each.
halo = WINDOWS.span - 1
my_prediction = (split - halo) // (20 * halo) >= 2 * 2 * 8
