# write the zarrtorch loader (use the table above)
import torch

train_ds = zt.ZarrIterableDataset(store, variables=["fields", "target"], shuffle=True, seed=42, buffer_chunks=8)
train_loader = zt.ZarrDataLoader(
    train_ds, batch_size=32, drop_last=False, num_workers=2, pin_memory=torch.cuda.is_available(), prefetch_factor=2
)
