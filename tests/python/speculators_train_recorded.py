"""speculators_train_cpu.py (speculators' trainer on CPU, arguments unchanged), which also
saves every sample its Mooncake transfer (--hidden-states-backend mooncake) hands the data
loader, for a test to compare with what hsx computed: what crossed the store, not what the
trainer made of it.

The directory is HSX_RECORD_DIR: sample N as N.safetensors (the tensors as
`transfer.get_generated` returned them, before speculators' own checks and dtype cast) and
N.json (the kv_transfer_params the server answered with). Runs with --num-workers 0, so
the loader calls the transfer in this process."""
import itertools
import json
import os
import pathlib

from safetensors.torch import save_file

import speculators_train_cpu  # noqa: F401 (its CPU patches)
from hs_connectors.transfer import MooncakeTransfer
from speculators.train.cli import main
from speculators.train.config import TrainConfig

OUT = pathlib.Path(os.environ["HSX_RECORD_DIR"])
_counter = itertools.count()


_get_generated = MooncakeTransfer.get_generated


def _get_generated_recorded(self, params):
    sample = _get_generated(self, params)
    if sample is not None:
        n = next(_counter)
        save_file({k: v.contiguous() for k, v in sample.items()}, str(OUT / f"{n}.safetensors"))
        (OUT / f"{n}.json").write_text(json.dumps(params))
    return sample


MooncakeTransfer.get_generated = _get_generated_recorded

if __name__ == "__main__":
    main(TrainConfig.resolve())
