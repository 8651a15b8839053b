# Write rollout_loss(model, batch): the mean of the +6 h and +12 h (rolled out) errors, in the change's variance
def rollout_loss(model, batch):
    now, later = batch["fields"][:, 0], batch["fields_target"]  # (B, C, lat, lon), (B, 2, C, lat, lon)
    first = model(now)  # the temperature at +6 h
    second_input = later[:, 0].clone()  # the observed step at +6 h ...
    second_input[:, 0] = first  # ... with the model's own temperature
    second = model(second_input)  # the temperature at +12 h, rolled out
    truth = later[:, :, 0]  # the observed temperatures at +6 h and +12 h
    first_error = (first - truth[:, 0]).pow(2).mean()
    second_error = (second - truth[:, 1]).pow(2).mean()
    return (first_error + second_error) / 2 / model.tendency_std**2
