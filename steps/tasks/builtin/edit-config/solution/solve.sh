#!/bin/bash
set -euo pipefail
# Only between the [server] header and the next section header.
sed -i '/^\[server\]$/,/^\[/{s/^port = 8000$/port = 8080/; s/^# debug = true$/debug = true/}' /app/app.ini
