#!/bin/bash
set -euo pipefail
echo openforge-shell-ok > /etc/openforge-check
echo openforge-tool-ok > /etc/openforge-tool-check
