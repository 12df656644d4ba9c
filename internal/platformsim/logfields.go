package platformsim

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// This file renders a request of the log model (logmodel.go) as a record:
// one small function per log-field code.

// logRequest is one logged request of the model, with everything its
// fields are derived from. h is its own randomness: a pure function of the
// seed, the environment, the bucket and the request's place in it.
type logRequest struct {
	h          hasher
	rc         *recordContext
	uuid       string
	ts         int64 // Unix microseconds
	bucket     int64 // start of its FIVE_MINUTES bucket, Unix seconds
	geo        *geo
	status     int64
	cache      string
	hit        bool // answered from the cache (hit or stale)
	bytesOut   int64
	ttfb       float64 // seconds
	total      float64 // seconds
	originTime float64 // seconds; 0 for a hit
	mt         methodType
	path       simPath
	host       string
	origin     string
	pop        simPop
	ipv6       bool
}

// timing draws the request's latencies from its country's final
// percentiles: one quantile for time to first byte and total time, so the
// first never exceeds the second.
func (r *logRequest) timing(f *countryFinal) {
	u := r.h.s("latency").u()
	r.ttfb = quantile(f.ttfb, u)
	r.total = quantile(f.rt, u)
	if !r.hit {
		r.originTime = min(r.ttfb*0.8, f.originTTFB50/1000*(0.5+r.h.s("origin-time").u()))
	}
}

// describe chooses what the model does not count: method and content type,
// path, host, origin, POP.
func (r *logRequest) describe() {
	h := r.h
	r.mt = pickWeighted(h.s("mt").u(), methodTypeWeights)
	paths := pathsByType[r.mt.ctype]
	r.path = paths[int(h.s("path").u()*float64(len(paths)))]
	r.host = r.rc.host(h.s("host"))
	r.origin = r.rc.origin(h.s("origin").u())
	r.pop = popByCode[r.geo.pops[int(h.s("pop").u()*float64(len(r.geo.pops)))]]
	r.ipv6 = h.s("ipv6").u() < 0.2
}

// record renders the request with the keys of shape.
func (r *logRequest) record(shape recordShape) logRecord {
	vals := make([]any, len(shape.keys))
	for i, k := range shape.keys {
		if name, ok := shape.custom[i]; ok {
			vals[i] = r.customValue(k, name)
		} else if f, ok := logFields[k]; ok {
			vals[i] = f(r)
		} else {
			vals[i] = r.byType(k)
		}
	}
	return logRecord{uuid: r.uuid, bucket: r.bucket, values: vals}
}

// n returns a hash-drawn integer in [0, k) for the named use.
func (r *logRequest) n(use string, k int) int { return int(r.h.s(use).u() * float64(k)) }

// pickH returns an element of xs chosen by h.
func pickH[T any](h hasher, xs []T) T { return xs[int(h.u()*float64(len(xs)))] }

func boolString(b bool) string { return strconv.FormatBool(b) }

// emptyUnless returns v when cond holds, else "".
func emptyUnless(cond bool, v string) string {
	if cond {
		return v
	}
	return ""
}

// logFields renders every catalogued field code the model knows.
var logFields = map[string]func(r *logRequest) any{
	"timestamp":           func(r *logRequest) any { return unixMicros(r.ts) },
	"uuid":                func(r *logRequest) any { return r.uuid },
	"account_number":      func(r *logRequest) any { return r.rc.accountNumber },
	"environment_id":      func(r *logRequest) any { return r.rc.environmentID },
	"status_code":         func(r *logRequest) any { return r.status },
	"method":              func(r *logRequest) any { return r.mt.method },
	"scheme":              func(*logRequest) any { return "https" },
	"proto":               func(r *logRequest) any { return pickH(r.h.s("proto"), simProtos) },
	"host":                func(r *logRequest) any { return r.host },
	"client_tls_sni":      func(r *logRequest) any { return r.host },
	"path":                func(r *logRequest) any { return r.path.path },
	"rewritten_path":      func(r *logRequest) any { return r.path.path },
	"query":               (*logRequest).query,
	"file_ext":            func(r *logRequest) any { return r.path.ext },
	"referer":             func(r *logRequest) any { return pickH(r.h.s("referer"), simReferers) },
	"user_agent":          func(r *logRequest) any { return pickH(r.h.s("ua"), simAgents) },
	"accept_encoding":     func(r *logRequest) any { return pickH(r.h.s("ae"), simAcceptEncodings) },
	"accept_language":     func(r *logRequest) any { return pickH(r.h.s("al"), simLanguages) },
	"range":               (*logRequest).rangeHeader,
	"x_forwarded_for":     (*logRequest).forwardedFor,
	"client_ip":           (*logRequest).clientIP,
	"client_port":         func(r *logRequest) any { return int64(1024 + r.n("port", 64511)) },
	"client_ip_version":   func(r *logRequest) any { return map[bool]string{true: "IPv6", false: "IPv4"}[r.ipv6] },
	"client_country_code": func(r *logRequest) any { return r.geo.code },
	"client_country":      func(r *logRequest) any { return r.geo.name },
	"client_region":       func(r *logRequest) any { return r.geo.region },
	"client_city":         func(r *logRequest) any { return r.geo.city },
	"client_geo_latitude": func(r *logRequest) any { return math.Round((r.geo.lat+r.h.s("lat").u()-0.5)*1e4) / 1e4 },
	"client_geo_longitude": func(r *logRequest) any {
		return math.Round((r.geo.lon+r.h.s("lon").u()-0.5)*1e4) / 1e4
	},
	"client_asn":         func(r *logRequest) any { return r.geo.asn },
	"client_as_org":      func(r *logRequest) any { return r.geo.org },
	"client_tls_version": func(r *logRequest) any { return pickH(r.h.s("tls"), simTLS) },
	"client_tls_cipher":  func(r *logRequest) any { return pickH(r.h.s("cipher"), simCiphers) },
	"client_tls_ja3_md5": func(r *logRequest) any {
		return fmt.Sprintf("%016x%016x", mix64(uint64(r.h.s("ja3"))), mix64(uint64(r.h.s("ja3b"))))
	},
	"bytes_in":            func(r *logRequest) any { return r.bytesIn() },
	"bytes_out":           func(r *logRequest) any { return r.bytesOut },
	"request_body_bytes":  func(r *logRequest) any { return max(0, r.bytesIn()-250) },
	"response_body_bytes": func(r *logRequest) any { return max(0, r.bytesOut-180) },
	"content_type":        func(r *logRequest) any { return r.path.ctype },
	"content_encoding":    (*logRequest).contentEncoding,
	"cache_control":       func(r *logRequest) any { return pickH(r.h.s("cc"), simCacheControls) },
	"location":            (*logRequest).redirect,
	"redirect_url":        (*logRequest).redirect,
	"cache_status":        func(r *logRequest) any { return r.cache },
	"cache_key":           func(r *logRequest) any { return r.host + r.path.path },
	"cacheable":           func(r *logRequest) any { return boolString(r.cache != "UNCACHEABLE" && r.cache != "CONFIG_NOCACHE") },
	"prefetch":            func(r *logRequest) any { return boolString(r.n("prefetch", 40) == 0) },
	"pop":                 func(r *logRequest) any { return r.pop.code },
	"edge_region":         func(r *logRequest) any { return r.pop.region },
	"server_ip":           func(r *logRequest) any { return fmt.Sprintf("192.0.2.%d", 1+r.n("server", 254)) },
	"server_port":         func(*logRequest) any { return int64(443) },
	"origin_name":         func(r *logRequest) any { return r.origin },
	"origin_ip":           func(r *logRequest) any { return emptyUnless(!r.hit, fmt.Sprintf("198.51.100.%d", 1+r.n("oip", 254))) },
	"origin_status_code":  (*logRequest).originStatus,
	"origin_time":         func(r *logRequest) any { return round6(r.originTime) },
	"origin_ttfb":         func(r *logRequest) any { return round6(r.originTime * 0.8) },
	"total_time":          func(r *logRequest) any { return round6(r.total) },
	"time_to_first_byte":  func(r *logRequest) any { return round6(r.ttfb) },
	"prewrite_time":       func(r *logRequest) any { return round6(r.ttfb * 0.7) },
	"tcp_rtt":             func(r *logRequest) any { return int64(2 + r.n("rtt", 180)) },
	"edge_function_time":  func(r *logRequest) any { return round6(0.0005 * -math.Log(1-r.h.s("ef").u())) },
	"image_optimized": func(r *logRequest) any {
		return boolString(strings.HasPrefix(r.path.ctype, "image/") && r.n("img", 2) == 0)
	},
	"waf_action":        func(r *logRequest) any { return pickH(r.h.s("waf"), simWAFActions) },
	"waf_rule_id":       (*logRequest).wafID,
	"waf_event_id":      (*logRequest).wafID,
	"rate_limit_action": func(r *logRequest) any { return emptyUnless(r.status == 429, "block") },
	"bot_action":        func(r *logRequest) any { return pickH(r.h.s("bot"), simBotActions) },
	"bot_score":         func(r *logRequest) any { return int64(1 + r.n("score", 99)) },
	"is_bot":            func(r *logRequest) any { return boolString(r.n("isbot", 8) == 0) },
	"error_message":     (*logRequest).errorMessage,
}

// unixMicros renders Unix microseconds as seconds with six decimals,
// exactly (no float rounding can move a record across a bucket boundary).
func unixMicros(us int64) json.Number {
	return json.Number(fmt.Sprintf("%d.%06d", us/1e6, us%1e6))
}

func (r *logRequest) query() any {
	if r.n("query", 4) != 0 {
		return ""
	}
	return fmt.Sprintf("v=%d&utm_source=%s", r.n("v", 100), pickH(r.h.s("utm"), []string{"newsletter", "ads", "social"}))
}

func (r *logRequest) rangeHeader() any {
	return emptyUnless(r.status == 206, fmt.Sprintf("bytes=%d-", r.n("range", 1<<20)))
}

func (r *logRequest) forwardedFor() any {
	return emptyUnless(r.n("xff", 10) == 0, fmt.Sprintf("10.%d.%d.%d", r.n("xff1", 256), r.n("xff2", 256), 1+r.n("xff3", 254)))
}

func (r *logRequest) clientIP() any {
	if r.ipv6 {
		return fmt.Sprintf("2001:db8:%x:%x::%x", r.n("ip1", 0xffff), r.n("ip2", 0xffff), 1+r.n("ip3", 0xfffe))
	}
	return fmt.Sprintf("%d.%d.%d.%d", 1+r.n("ip1", 222), r.n("ip2", 256), r.n("ip3", 256), 1+r.n("ip4", 254))
}

func (r *logRequest) bytesIn() int64 {
	n := int64(250 + r.n("in", 1500))
	if r.mt.method == "POST" {
		n += int64(r.n("body", 20000))
	}
	return n
}

func (r *logRequest) contentEncoding() any {
	c := r.path.ctype
	compressible := strings.HasPrefix(c, "text/") || strings.Contains(c, "javascript") || strings.Contains(c, "json")
	return emptyUnless(compressible, pickH(r.h.s("ce"), []string{"br", "gzip"}))
}

func (r *logRequest) redirect() any {
	return emptyUnless(r.status == 301 || r.status == 302, "https://"+r.host+r.path.path+"/")
}

func (r *logRequest) originStatus() any {
	if r.hit {
		return int64(0)
	}
	return r.status
}

func (r *logRequest) wafID() any {
	return emptyUnless(r.n("wafid", 12) == 0, strconv.Itoa(900000+r.n("wafrule", 99999)))
}

func (r *logRequest) errorMessage() any {
	return emptyUnless(r.status >= 500, pickH(r.h.s("err"), []string{"origin connect timeout", "origin returned 5xx", "upstream reset"}))
}

// byType produces a value for a catalogued code logFields does not know (a
// code added to the catalogue later).
func (r *logRequest) byType(code string) any {
	t, _ := accesslog.FieldTypeOf(code)
	h := r.h.s(code)
	switch t {
	case accesslog.TypeInteger:
		return int64(h.u() * 1000)
	case accesslog.TypeFloat:
		return round6(h.u())
	case accesslog.TypeTimestamp:
		return unixMicros(r.ts)
	}
	return fmt.Sprintf("%s-%d", code, int(h.u()*100))
}

// customValue produces a custom request header, response header or cookie
// value.
func (r *logRequest) customValue(key, name string) string {
	h := r.h.s(key)
	switch strings.ToLower(name) {
	case "x-request-id", "x-correlation-id":
		return fmt.Sprintf("%016x", mix64(uint64(h)))
	case "x-device-type":
		return pickH(h, []string{"desktop", "mobile", "tablet"})
	case "content-language":
		return pickH(h, []string{"en", "de", "fr", "ja"})
	case "x-cache":
		return map[bool]string{true: "HIT", false: "MISS"}[r.hit]
	}
	switch {
	case strings.HasPrefix(key, accesslog.CookiePrefix):
		return emptyUnless(h.s("set").u() >= 0.25, fmt.Sprintf("%016x", mix64(uint64(h))))
	case h.s("set").u() < 0.2:
		return ""
	}
	return fmt.Sprintf("%s-%d", strings.ToLower(name), int(h.u()*1000))
}

// host returns the request's host: one of the environment's.
func (rc *recordContext) host(h hasher) string { return pickH(h, rc.hosts) }

// origin returns the origin of a request, by the environment's origin
// weights.
func (rc *recordContext) origin(u float64) string {
	if len(rc.originW) != len(rc.origins) {
		return rc.origins[int(u*float64(len(rc.origins)))]
	}
	for i, w := range rc.originW {
		if u < w {
			return rc.origins[i]
		}
		u -= w
	}
	return rc.origins[len(rc.origins)-1]
}

// passes reports whether the profile's filters let the record through.
func (rc *recordContext) passes(r *logRequest) bool {
	f := rc.filters
	if f == nil {
		return true
	}
	if !statusAllowed(f, r.status) {
		return false
	}
	if hn := f.HostNames; hn != nil && len(hn.Names) > 0 {
		return slices.Contains(hn.Names, r.host) == (hn.Condition == "in")
	}
	return true
}

// statusAllowed reports whether the status passes a status_codes filter.
func statusAllowed(f *rtldFilters, status int64) bool {
	if len(f.StatusCodes) == 0 {
		return true
	}
	s := strconv.FormatInt(status, 10)
	for _, c := range f.StatusCodes {
		if c == s || (strings.HasSuffix(c, "xx") && c[0] == s[0]) {
			return true
		}
	}
	return false
}

// geo is what the logs say about a country of the model.
type geo struct {
	code, name, region, city string // code: client_country_code
	lat, lon                 float64
	asn                      int64
	org                      string
	pops                     []string // POPs that serve it
}

// geos are keyed by the model's country code (countries).
var geos = map[string]*geo{
	"us": {"US", "United States", "VA", "Ashburn", 39.04, -77.49, 7922, "Comcast Cable", []string{"iad", "ord", "dfw", "lax", "sjc"}},
	"de": {"DE", "Germany", "HE", "Frankfurt", 50.11, 8.68, 3320, "Deutsche Telekom AG", []string{"fra"}},
	"gb": {"GB", "United Kingdom", "ENG", "London", 51.51, -0.13, 2856, "British Telecommunications", []string{"lhr"}},
	"fr": {"FR", "France", "IDF", "Paris", 48.86, 2.35, 3215, "Orange S.A.", []string{"cdg"}},
	"jp": {"JP", "Japan", "13", "Tokyo", 35.68, 139.69, 2516, "KDDI Corporation", []string{"nrt"}},
	"br": {"BR", "Brazil", "SP", "Sao Paulo", -23.55, -46.63, 28573, "Claro S.A.", []string{"gru"}},
	"in": {"IN", "India", "MH", "Mumbai", 19.08, 72.88, 55836, "Reliance Jio", []string{"bom", "sin"}},
	"ca": {"CA", "Canada", "ON", "Toronto", 43.65, -79.38, 812, "Rogers Communications", []string{"ord", "iad"}},
	"au": {"AU", "Australia", "NSW", "Sydney", -33.87, 151.21, 1221, "Telstra", []string{"syd"}},
	"nl": {"NL", "Netherlands", "NH", "Amsterdam", 52.37, 4.90, 1136, "KPN B.V.", []string{"ams"}},
	"es": {"ES", "Spain", "MD", "Madrid", 40.42, -3.70, 3352, "Telefonica de Espana", []string{"mad", "cdg"}},
	"it": {"IT", "Italy", "25", "Milan", 45.46, 9.19, 3269, "Telecom Italia", []string{"mxp", "fra"}},
	"sg": {"SG", "Singapore", "01", "Singapore", 1.35, 103.82, 9506, "Singtel", []string{"sin"}},
	"za": {"ZA", "South Africa", "GP", "Johannesburg", -26.20, 28.05, 37457, "Telkom SA", []string{"jnb"}},
	"-":  {"-", "", "", "", 0, 0, 0, "", []string{"iad", "fra", "sin"}},
}

// geoOf returns the geo of a model country code.
func geoOf(code string) *geo { return geos[code] }

// simPop is an edge point of presence.
type simPop struct{ code, region string }

var simPops = []simPop{
	{"iad", "us-east"}, {"ord", "us-central"}, {"dfw", "us-central"}, {"lax", "us-west"},
	{"sjc", "us-west"}, {"fra", "eu-central"}, {"ams", "eu-west"}, {"lhr", "eu-west"},
	{"cdg", "eu-west"}, {"mad", "eu-south"}, {"mxp", "eu-south"}, {"nrt", "ap-northeast"},
	{"sin", "ap-southeast"}, {"syd", "ap-southeast"}, {"bom", "ap-south"}, {"gru", "sa-east"},
	{"jnb", "af-south"},
}

var popByCode = func() map[string]simPop {
	m := make(map[string]simPop, len(simPops))
	for _, p := range simPops {
		m[p.code] = p
	}
	return m
}()

// methodTypeWeights is methodTypes for pickWeighted: the edge traffic's mix
// of method and content type (origin_offload's).
var methodTypeWeights = func() []weighted[methodType] {
	out := make([]weighted[methodType], len(methodTypes))
	for i, mt := range methodTypes {
		out[i] = weighted[methodType]{mt, mt.weight}
	}
	return out
}()

// simPath is a path with its extension and Content-Type.
type simPath struct{ path, ext, ctype string }

// pathsByType are the paths of each of the model's content types.
var pathsByType = map[string][]simPath{
	"text/html": {{"/", "", "text/html; charset=utf-8"}, {"/index.html", "html", "text/html; charset=utf-8"},
		{"/products/widget-42", "", "text/html; charset=utf-8"}, {"/blog/2026/edge-caching", "", "text/html; charset=utf-8"}},
	"application/json": {{"/api/v2/cart", "", "application/json"}, {"/api/v2/search", "", "application/json"},
		{"/api/v2/products/42", "", "application/json"}},
	"image/webp":             {{"/images/hero.webp", "webp", "image/webp"}, {"/images/products/42.webp", "webp", "image/webp"}},
	"image/jpeg":             {{"/images/team.jpg", "jpg", "image/jpeg"}, {"/images/banner.jpeg", "jpeg", "image/jpeg"}},
	"application/javascript": {{"/static/js/app.3f9a1c.js", "js", "application/javascript"}, {"/static/js/vendor.91b2e4.js", "js", "application/javascript"}},
	"text/css":               {{"/static/css/site.8b21e0.css", "css", "text/css"}},
	"video/mp4":              {{"/video/intro/seg-00017.mp4", "mp4", "video/mp4"}, {"/video/intro/seg-00018.mp4", "mp4", "video/mp4"}},
	"font/woff2":             {{"/fonts/inter-var.woff2", "woff2", "font/woff2"}},
}

var (
	simAgents = []string{
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_6) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
		"Mozilla/5.0 (X11; Linux x86_64; rv:132.0) Gecko/20100101 Firefox/132.0",
		"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
		"curl/8.5.0",
		"okhttp/4.12.0",
	}
	simProtos          = []string{"HTTP/2.0", "HTTP/2.0", "HTTP/1.1", "HTTP/3"}
	simTLS             = []string{"TLSv1.3", "TLSv1.3", "TLSv1.3", "TLSv1.2"}
	simCiphers         = []string{"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "ECDHE-RSA-AES128-GCM-SHA256"}
	simLanguages       = []string{"en-US,en;q=0.9", "de-DE,de;q=0.9,en;q=0.8", "fr-FR,fr;q=0.9", "ja-JP,ja;q=0.9", "pt-BR,pt;q=0.9"}
	simReferers        = []string{"", "https://www.google.com/", "https://duckduckgo.com/", "https://t.co/", "https://news.ycombinator.com/"}
	simAcceptEncodings = []string{"gzip, deflate, br", "gzip, deflate, br, zstd", "gzip", ""}
	simCacheControls   = []string{"public, max-age=31536000, immutable", "public, max-age=300", "no-store", "private, max-age=0"}
	simWAFActions      = []string{"", "", "", "", "", "", "", "", "alert", "block"}
	simBotActions      = []string{"", "", "", "", "allow", "challenge"}
)
