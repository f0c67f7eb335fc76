"""`python -m speculators.train` on a machine without an accelerator (CI), arguments unchanged.

speculators 0.9's Trainer is CUDA-only in two places, both in speculators/train/trainer.py:
- it moves the model and every batch with `.to(self.local_rank)`, where local_rank is the
  int from get_local_rank(): an int device is CUDA device 0 to torch;
- it autocasts with `device_type = "cuda"` when torch finds no accelerator;
- its step timer calls torch.accelerator.synchronize(), which needs a device.
This shim makes get_local_rank() answer "cpu" inside the trainer module, sets the autocast
device to "cpu" (CPU autocast to the same --hidden-states-dtype) and makes synchronize() a
no-op when there is no accelerator (CPU work is done when its call returns). The model, the
data loading, the loss, the optimizer and the checkpoint writer are speculators' own code,
run unchanged."""
import torch

import speculators.train.trainer as trainer
from speculators.train.cli import main
from speculators.train.config import TrainConfig

if torch.accelerator.is_available():
    raise SystemExit("speculators_train_cpu.py is for machines without an accelerator: run python -m speculators.train")
trainer.get_local_rank = lambda: "cpu"
torch.accelerator.synchronize = lambda device=None: None
_init = trainer.Trainer.__init__


def _init_on_cpu(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.device_type = "cpu"


trainer.Trainer.__init__ = _init_on_cpu

if __name__ == "__main__":
    main(TrainConfig.resolve())
