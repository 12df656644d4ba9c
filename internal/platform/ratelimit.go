package platform

import (
	"fmt"
	"net/http"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit is a client-side request budget: at most Requests requests in
// any window of length Per. The zero value means "use the default".
type RateLimit struct {
	// Requests is the budget per window. Negative disables limiting.
	Requests int
	// Per is the window length (default 5 minutes).
	Per time.Duration
	// Burst is how many requests may go out back to back (default
	// Requests/20, at least 1). The steady rate is lowered by the burst so
	// that no window of length Per ever holds more than Requests requests.
	Burst int
}

// Limits are a service's budgets per method class: Read for GET and HEAD,
// Write for POST, PUT, PATCH and DELETE (section 8 of the spec counts them
// separately).
type Limits struct {
	Read, Write RateLimit
}

// specWindow is the window of the spec's rate limits.
const specWindow = 5 * time.Minute

// DefaultRateLimits returns the budgets of the spec's section 8 by service
// name: accounts and config 2000 reads and 600 writes per 5 minutes, cache
// 2000 requests per 5 minutes. The metrics and rtld services document no
// limit; they get the accounts budgets (2000 reads, 600 writes per 5
// minutes), except that metrics data queries are POSTs that read, so metrics
// gets 2000 per 5 minutes for both classes. Services not listed get the
// accounts budgets.
func DefaultRateLimits() map[string]Limits {
	reads := RateLimit{Requests: 2000, Per: specWindow}
	writes := RateLimit{Requests: 600, Per: specWindow}
	return map[string]Limits{
		ServiceAccounts: {Read: reads, Write: writes},
		ServiceConfig:   {Read: reads, Write: writes},
		"cache":         {Read: reads, Write: reads},
		ServiceMetrics:  {Read: reads, Write: reads},
		ServiceRTLD:     {Read: reads, Write: writes},
	}
}

// limitsFor merges a configured budget over the default one.
func limitsFor(service string, configured map[string]Limits) Limits {
	def, ok := DefaultRateLimits()[service]
	if !ok {
		def = DefaultRateLimits()[ServiceAccounts]
	}
	c, ok := configured[service]
	if !ok {
		return def
	}
	if c.Read == (RateLimit{}) {
		c.Read = def.Read
	}
	if c.Write == (RateLimit{}) {
		c.Write = def.Write
	}
	return c
}

func (l RateLimit) validate() error {
	if l.Requests < 0 {
		return nil
	}
	if l.Per < 0 || l.Burst < 0 {
		return fmt.Errorf("rate limit %d per %s (burst %d): negative window or burst", l.Requests, l.Per, l.Burst)
	}
	if l.Requests > 0 && l.Burst > l.Requests {
		return fmt.Errorf("rate limit %d per %s: burst %d exceeds the budget", l.Requests, l.Per, l.Burst)
	}
	return nil
}

// limiter builds the token bucket for l. A bucket of size B refilled at rate r
// lets through at most B + r·Per requests in any window of length Per, so
// r = (Requests − B) / Per keeps every window within the budget.
func (l RateLimit) limiter() *rate.Limiter {
	if l.Requests < 0 {
		return rate.NewLimiter(rate.Inf, 0)
	}
	per := l.Per
	if per == 0 {
		per = specWindow
	}
	n := l.Requests
	if n == 0 {
		n = 1
	}
	burst := l.Burst
	if burst == 0 {
		burst = max(n/20, 1)
	}
	refill := n - burst
	if refill <= 0 {
		// Tiny budgets: fall back to an even spread.
		burst, refill = 1, max(n-1, 1)
	}
	return rate.NewLimiter(rate.Limit(float64(refill)/per.Seconds()), burst)
}

// limiterPair holds one service's limiters.
type limiterPair struct {
	read, write *rate.Limiter
}

func (p limiterPair) forMethod(method string) *rate.Limiter {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return p.read
	}
	return p.write
}
