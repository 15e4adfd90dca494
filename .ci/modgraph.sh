#!/usr/bin/env bash
# The module graph a service sees: builds a throwaway consumer module in a temp dir that
# imports fleetlimit's hybrid, global and httplimit packages (a replace directive points at this
# checkout), runs go mod tidy and go list -m all, prints the list, and fails if fleetlimit
# brings in more than MAX_MODULES modules (default 20: the list less the consumer and
# fleetlimit themselves), any plotting, font, PDF or image module (those belong to the
# nested module sim/plot) or any Prometheus or OpenTelemetry module (those belong to the
# nested modules prommetrics and otelmetrics).
# Needs the Go module proxy (or a module cache holding the dependencies).
# Run from anywhere: bash .ci/modgraph.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
max=${MAX_MODULES:-20}
dir=$(mktemp -d "${TMPDIR:-/tmp}/fleetlimit-consumer.XXXXXX")
trap 'rm -rf "$dir"' EXIT

cat >"$dir/go.mod" <<GOMOD
module example.com/consumer

go 1.26.0

require github.com/fleetlimit/fleetlimit v0.0.0

replace github.com/fleetlimit/fleetlimit => $root
GOMOD
cat >"$dir/main.go" <<'GO'
// Command consumer is a service that imports only the packages a service needs.
package main

import (
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

func main() {
	_ = hybrid.New
	_ = global.New
	_ = httplimit.New
}
GO

cd "$dir"
# The consumer stands alone: no workspace, and none of the caller's GOFLAGS (CI's
# -count=1 is for go test; a -mod=vendor would stop go mod tidy).
export GOWORK=off GOFLAGS=
go mod tidy
go build ./...
go list -m all
modules=$(go list -m -f '{{if not .Main}}{{.Path}} {{.Version}}{{end}}' all | grep -v '^github.com/fleetlimit/fleetlimit ' | grep .)
count=$(wc -l <<<"$modules")
echo "modgraph: fleetlimit brings $count modules into a service that imports hybrid, global and httplimit (at most $max)"
status=0
if ((count > max)); then
	echo "modgraph: $count modules, more than $max" >&2
	echo "$modules" >&2
	status=1
fi
banned='gonum|plot|font|latex|pdf|freetype|golang\.org/x/image|svgo|sbinet|/gg( |$)'
if bad=$(grep -Ei "$banned" <<<"$modules"); then
	echo "modgraph: plotting, font, PDF or image modules in a service's module graph:" >&2
	echo "$bad" >&2
	status=1
fi
if bad=$(grep -Ei 'prometheus|opentelemetry' <<<"$modules"); then
	echo "modgraph: Prometheus or OpenTelemetry modules in a service's module graph:" >&2
	echo "$bad" >&2
	status=1
fi
exit $status
