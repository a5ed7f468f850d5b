"""`python -m steps.sft`: supervised fine-tuning on SFT samples (`steps.sft.train`)."""

import sys

from steps.sft.train import main

if __name__ == "__main__":
    sys.exit(main())
