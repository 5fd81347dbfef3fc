"""`python -m cluster.cli` is the `shardlimit` command."""

import sys

from cluster.cli.main import main

sys.exit(main())
