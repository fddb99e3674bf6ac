#!/usr/bin/env bash
# Calls the JSON gateway with curl: the sources, a decision, a search and one
# refused call. Each answer is the envelope {code, message, data}; the script
# prints one line per call: the HTTP status, a tab, then the envelope.
#
# Usage: TYPESAFE_URL=http://127.0.0.1:8080 TYPESAFE_KEY=ts_live_… bash examples/curl/call.sh
set -euo pipefail

url="${TYPESAFE_URL:-http://127.0.0.1:8080}"
key="${TYPESAFE_KEY:?set TYPESAFE_KEY to an API key (npm run --silent admin -- accounts create)}"

# One call: METHOD PATH [JSON BODY]. curl prints the body, then a tab and the status;
# the two are swapped so the status comes first.
call() {
  local method="$1" path="$2" body="${3:-}"
  local args=(-sS -X "$method" "$url$path" -H "authorization: Bearer $key" -w '\t%{http_code}')
  if [ -n "$body" ]; then args+=(-H 'content-type: application/json' --data-binary "$body"); fi
  local answer
  answer="$(curl "${args[@]}")"
  printf '%s\t%s\n' "${answer##*$'\t'}" "${answer%$'\t'*}"
}

# Which sources this deployment has, their prices, and which a search uses by default.
call GET /api/v1/sources

# One yes/no question and one choice about a text state.
call POST /api/v1/decisions '{
  "model": "typesafe/service-1.13",
  "state": "I was charged twice for my March invoice",
  "questions": {
    "refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
    "team": {"type": "choice", "instructions": "Which team should handle it?",
             "criteria": {"billing": null, "technical": null}}
  }
}'

# A search with only q: the default sources, any time.
call POST /api/v1/search '{"q": "postgres vacuum"}'

# A refused call: 400, and data names the field and the rule it broke.
call POST /api/v1/search '{"q": "postgres vacuum", "w": "1y"}'
