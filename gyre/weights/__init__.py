"""Weight transport: policy snapshots (`snapshot.py`) moved from the publisher to readers
by one of several backends behind one interface (`base.py`): shared memory on one host
(`shm.py`), a torch.distributed broadcast (`dist.py`), the Mooncake Transfer Engine
(`mooncake.py`, optional extra, imported only there)."""

from gyre.weights.base import PullRecord, Pulled, WeightTransport
from gyre.weights.snapshot import Snapshot, from_module, from_state_dict, load_into

__all__ = ["PullRecord", "Pulled", "Snapshot", "WeightTransport", "from_module", "from_state_dict", "load_into"]
