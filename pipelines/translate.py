"""`python -m pipelines.translate`: runs `pipelines.commands.translate.main`."""

import sys

from pipelines.commands.translate import main

if __name__ == "__main__":
    sys.exit(main())
