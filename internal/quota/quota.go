// Package quota reads, for the middlewares of this module, the quota a hybrid.Limiter
// states for a limit: httplimit lists it in the RateLimit-Policy header of a request
// other limits decided, and it and grpclimit check the limit names they are configured
// with.
package quota

import "time"

// Of returns the Quota and Window a Decision under the named limit and tier of a
// *hybrid.Limiter reports, or hybrid.ErrUnknownLimit or hybrid.ErrUnknownTier. Package
// hybrid sets it when it is initialized; the Limiter is passed as any because hybrid
// imports this package.
var Of func(limiter any, limit, tier string) (quota int, window time.Duration, err error)
