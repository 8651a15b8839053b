pace = median[0, "default"]  # rows/s the default reached without delay
# Little's law: requests in flight = rate x time each request takes, counted in chunks of CHUNK_ROWS rows
need = math.ceil(pace * 0.100 / CHUNK_ROWS)
