"""`python bench/trajectories.py [--quick] [--no-fb]`: the trajectory processor's benchmark.

The measurement lives in `gyre/trajectories/bench.py` (so `gyre bench trajectories` can
import it from the installed package); this script prints its JSON.
"""

import sys

from gyre.trajectories.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
