// Package echolimit puts an httplimit.Middleware in front of echo routes: the same
// decisions, headers, denials and errors as the net/http middleware, as an
// echo.MiddlewareFunc. It is a module of its own, so that a service that does not use
// echo does not get it in its module graph.
package echolimit

import (
	"github.com/labstack/echo/v4"

	"github.com/fleetlimit/fleetlimit/httplimit"
)

// New returns an echo.MiddlewareFunc that decides each request with mw
// (httplimit.Check): an admitted request goes on to the next handler with its Decision
// in its context (httplimit.FromContext(c.Request().Context())) and the rate-limit
// headers written; a denied one, or one whose key cannot be found, is answered by mw
// (its Deny, its OnError) and the next handler is not run. Use it as
// e.Use(echolimit.New(mw)), or per route or group.
func New(mw *httplimit.Middleware) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r, ok := mw.Check(c.Response(), c.Request())
			if !ok {
				return nil // answered
			}
			c.SetRequest(r)
			return next(c)
		}
	}
}
