package ginlimit_test

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/httplimit/ginlimit"
	"github.com/fleetlimit/fleetlimit/httplimit/internal/adaptertest"
)

// TestGin: through gin, the adapters' contract (adaptertest.Check): admitted requests
// reach the handler with their Decision and the headers, a denied one gets 429 and the
// handler is not run, a request without a key gets 400, a skipped one passes untouched.
func TestGin(t *testing.T) {
	gin.SetMode(gin.TestMode)
	items := &adaptertest.Items{T: t}
	r := gin.New()
	r.Use(ginlimit.New(adaptertest.Middleware(t, adaptertest.Tight)))
	r.GET("/v1/items", gin.WrapH(items))
	r.GET("/healthz", func(c *gin.Context) { c.Status(http.StatusOK) })
	adaptertest.Check(t, r, items)
}

// BenchmarkGin: a gin route behind the limiter, a decision from the lease, against the
// same route without it.
func BenchmarkGin(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	route := func(mw *httplimit.Middleware) http.Handler {
		r := gin.New()
		if mw != nil {
			r.Use(ginlimit.New(mw))
		}
		r.GET("/", func(c *gin.Context) { c.Status(http.StatusNoContent) })
		return r
	}
	adaptertest.Bench(b, route(nil), route(adaptertest.Middleware(b, adaptertest.Endless)))
}
