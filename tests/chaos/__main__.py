"""`python -m tests.chaos`: run the chaos suite (CHAOS_KILLS=N, default 100)."""

import sys

from tests.chaos.run import main

sys.exit(main())
