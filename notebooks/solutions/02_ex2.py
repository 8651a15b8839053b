def safe_naive_split(order, world):
    shares = naive_split(order, world)
    n = min(len(share) for share in shares) // BATCH  # the fewest full batches any rank has
    return [[share[i * BATCH : (i + 1) * BATCH] for i in range(n)] for share in shares]
