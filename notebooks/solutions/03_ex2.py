shorter_chunks_spread_less = True  # the same rows in the buffer come from more, shorter stretches of time


def stream_of(chunk_len, epoch):
    n = -(-rows // chunk_len)
    order = np.random.default_rng((SEED, epoch)).permutation(n)
    return np.concatenate([np.arange(c * chunk_len, min((c + 1) * chunk_len, rows)) for c in order])
