"""`python -m pipelines.ctranslate2_export`: runs `pipelines.commands.ctranslate2_export.main`."""

import sys

from pipelines.commands.ctranslate2_export import main

if __name__ == "__main__":
    sys.exit(main())
