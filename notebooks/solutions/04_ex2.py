# Only the decoded chunks change: each of the 2 reading processes holds 6 chunks fewer (buffer 8 -> 2)
my_prediction_mib = (budget.total - budget.readers * 6 * chunk_bytes) / 2**20
