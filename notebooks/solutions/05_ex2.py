# Write WorkersDataModule (a training loader with 2 persistent workers) and your prediction, True or False
class WorkersDataModule(MiniDataModule):
    def train_dataloader(self):
        return zt.ZarrDataLoader(
            self.train_dataset, batch_size=self.batch_size, drop_last=True, num_workers=2, persistent_workers=True
        )


# Lightning calls set_epoch on the loader's sampler every epoch; the loader passes the epoch on to its
# persistent workers, which draw the new order
my_prediction = True
