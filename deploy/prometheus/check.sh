#!/usr/bin/env bash
# Checks the monitoring files (docs/deploy.md, "Dashboards and alerts"):
#   - deploy/prometheus/alerts.yml parses and its expressions are valid PromQL;
#   - deploy/prometheus/prometheus.yml is a valid configuration (it loads alerts.yml);
#   - deploy/prometheus/alerts.test.yml passes, and it tests every alert of alerts.yml firing;
#   - deploy/grafana/aptix-dashboard.json is JSON, every panel has a query, and every query
#     is valid PromQL once the dashboard's variables are filled in;
#   - with `metrics FILE`: a live worker's /metrics text passes `promtool check metrics`.
# Installs promtool (Debian/Ubuntu package `prometheus`) when it is missing. Needs python3.
#   bash deploy/prometheus/check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

log() { printf '\n== %s\n' "$*"; }

install_promtool() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  log "promtool not found: installing the prometheus package"
  # In a container without an init system the package's postinst cannot start the service:
  # refuse service starts for the install (exit 101 = "not allowed"), unless a policy exists.
  local policy=/usr/sbin/policy-rc.d made_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod +x "$policy"
    made_policy=1
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
  # A postinst that still fails to start the service must not stop us: promtool is unpacked
  # by then, which is checked below.
  $sudo env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends prometheus || true
  if [ -n "$made_policy" ]; then $sudo rm -f "$policy"; fi
  command -v promtool >/dev/null || { echo "promtool is still missing" >&2; exit 1; }
}

command -v promtool >/dev/null || install_promtool
promtool --version 2>&1 | head -n1

# `check.sh metrics FILE`: only check a live worker's /metrics text (tests/metrics.rs writes
# one to tests/out/metrics.txt; .ci/run checks it after the tests).
if [ "${1:-}" = "metrics" ]; then
  log "a live worker's /metrics (${2:?a file with the text})"
  promtool check metrics < "$2"
  echo "metrics text OK"
  exit 0
fi

log "alert rules"
promtool check rules deploy/prometheus/alerts.yml

log "Prometheus configuration"
promtool check config deploy/prometheus/prometheus.yml

log "alert rule unit tests"
promtool test rules deploy/prometheus/alerts.test.yml

log "every alert has a test where it fires"
python3 - <<'EOF'
import re, sys
alerts = re.findall(r'^\s*- alert:\s*(\S+)', open('deploy/prometheus/alerts.yml').read(), re.M)
tested = set()
current = None
for line in open('deploy/prometheus/alerts.test.yml'):
    m = re.match(r'\s*alertname:\s*(\S+)', line)
    if m:
        current = m.group(1)
    elif re.match(r'\s*- eval_time:', line):
        current = None
    elif current and re.match(r'\s*- exp_labels:', line):
        tested.add(current)
missing = [a for a in alerts if a not in tested]
if missing:
    sys.exit("alerts without a firing test in alerts.test.yml: " + ", ".join(missing))
print(f"{len(alerts)} alerts, each with a firing test")
EOF

log "Grafana dashboard"
python3 -m json.tool deploy/grafana/aptix-dashboard.json >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/dashboard-rules.json" <<'EOF'
import json, sys
d = json.load(open('deploy/grafana/aptix-dashboard.json'))
panels = [p for p in d['panels'] if p.get('type') != 'row']
panels += [q for p in d['panels'] if p.get('type') == 'row' for q in p.get('panels', [])]
bad = [p.get('title') for p in panels
       if not p.get('targets') or any(not t.get('expr', '').strip() for t in p['targets'])]
if bad:
    sys.exit("panels without a query: " + ", ".join(map(str, bad)))
# Fill in the variables (as Grafana would for one value) so promtool can parse each query.
fill = {'${prefix}': 'aptix', '$rabbitmq_job': 'rabbitmq', '$job': 'aptix',
        '$__rate_interval': '1m', '$__range': '1h'}
rules = []
for p in panels:
    for t in p['targets']:
        expr = t['expr']
        for k, v in fill.items():
            expr = expr.replace(k, v)
        rules.append({'record': f'dashboard:query_{len(rules)}', 'expr': expr})
json.dump({'groups': [{'name': 'dashboard', 'rules': rules}]}, open(sys.argv[1], 'w'))
print(f"{len(panels)} panels, {len(rules)} queries")
EOF
promtool check rules "$tmp/dashboard-rules.json"

log "monitoring files OK"
