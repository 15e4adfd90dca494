package echolimit_test

import (
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/httplimit/echolimit"
	"github.com/fleetlimit/fleetlimit/httplimit/internal/adaptertest"
)

// TestEcho: through echo, the adapters' contract (adaptertest.Check): admitted requests
// reach the handler with their Decision and the headers, a denied one gets 429 and the
// handler is not run, a request without a key gets 400, a skipped one passes untouched.
func TestEcho(t *testing.T) {
	items := &adaptertest.Items{T: t}
	e := echo.New()
	e.Use(echolimit.New(adaptertest.Middleware(t, adaptertest.Tight)))
	e.GET("/v1/items", echo.WrapHandler(items))
	e.GET("/healthz", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	adaptertest.Check(t, e, items)
}

// BenchmarkEcho: an echo route behind the limiter, a decision from the lease, against
// the same route without it.
func BenchmarkEcho(b *testing.B) {
	route := func(mw *httplimit.Middleware) http.Handler {
		e := echo.New()
		if mw != nil {
			e.Use(echolimit.New(mw))
		}
		e.GET("/", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
		return e
	}
	adaptertest.Bench(b, route(nil), route(adaptertest.Middleware(b, adaptertest.Endless)))
}
