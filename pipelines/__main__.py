"""`python -m pipelines COMMAND ...`: the `kt` command."""

import sys

from pipelines.cli import main

sys.exit(main())
