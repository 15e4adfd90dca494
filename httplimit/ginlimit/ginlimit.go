// Package ginlimit puts an httplimit.Middleware in front of gin routes: the same
// decisions, headers, denials and errors as the net/http middleware, as a
// gin.HandlerFunc. It is a module of its own, so that a service that does not use gin
// does not get it in its module graph.
package ginlimit

import (
	"github.com/gin-gonic/gin"

	"github.com/fleetlimit/fleetlimit/httplimit"
)

// New returns a gin.HandlerFunc that decides each request with mw (httplimit.Check):
// an admitted request goes on down the chain with its Decision in its context
// (httplimit.FromContext(c.Request.Context())) and the rate-limit headers written; a
// denied one, or one whose key cannot be found, is answered by mw (its Deny, its
// OnError) and the chain is aborted. Use it as engine.Use(ginlimit.New(mw)), or per
// route or group.
func New(mw *httplimit.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		r, ok := mw.Check(c.Writer, c.Request)
		if !ok {
			c.Abort()
			return
		}
		c.Request = r
		c.Next()
	}
}
