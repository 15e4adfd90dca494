package ginlimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/httplimit/ginlimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// Each API key gets 100 requests a second, bursts of 200, across the fleet, on every
// route of a gin engine.
func Example() {
	m := miniredis.NewMiniRedis() // your Redis
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	opts := &redis.Options{Addr: m.Addr()}
	global.Configure(opts)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	store, err := global.New(rdb)
	if err != nil {
		panic(err)
	}
	lim, err := hybrid.New(store, hybrid.Config{FleetSize: 4,
		Limits: []hybrid.Limit{{Name: "api", Rate: 100, Burst: 200, Policy: breaker.FailOpen, MaxWait: time.Second}}})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())
	mw, err := httplimit.New(httplimit.Config{Limiter: lim, Limit: "api", Key: httplimit.Header("X-API-Key")})
	if err != nil {
		panic(err)
	}

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(ginlimit.New(mw))
	r.GET("/v1/items", func(c *gin.Context) { c.String(http.StatusOK, "items") })

	req := httptest.NewRequest(http.MethodGet, "/v1/items", nil)
	req.Header.Set("X-API-Key", "key-1")
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"))
	// Output:
	// 200 "api";q=200;w=2
}
