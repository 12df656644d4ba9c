package platformsim

import (
	"bytes"
	"crypto/rand"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/gzip"

	"github.com/edgepipe/edgepipe/internal/accesslog"
)

// deliveryPlatform is the "platform" value of json batches.
const deliveryPlatform = "edge"

// logRecord is one access-log record: values in the order of its batch's
// keys.
type logRecord struct {
	uuid   string
	values []any // string, int64, float64 or json.Number (timestamp)
}

// recordShape is the key list of a profile's records: its fields followed by
// the custom request header, response header and cookie fields.
type recordShape struct {
	keys []string
	// custom maps a key index to the header or cookie name it carries.
	custom map[int]string
}

func shapeOf(p rtldProfile) recordShape {
	s := recordShape{custom: map[int]string{}}
	s.keys = append(s.keys, p.Fields...)
	add := func(names []string, key func(string) string) {
		for _, n := range names {
			k := key(n)
			if slices.Contains(s.keys, k) {
				continue
			}
			s.custom[len(s.keys)] = n
			s.keys = append(s.keys, k)
		}
	}
	add(p.CustomRequestHeaders, accesslog.RequestHeaderField)
	add(p.CustomResponseHeaders, accesslog.ResponseHeaderField)
	add(p.CustomCookies, accesslog.CookieField)
	return s
}

// recordContext is what a record generator needs to know about the profile's
// environment.
type recordContext struct {
	accountNumber string
	environmentID string
	hosts         []string
	origins       []string
	filters       *rtldFilters
}

var (
	simPops = []struct{ code, region string }{
		{"iad", "us-east"}, {"ord", "us-central"}, {"dfw", "us-central"}, {"lax", "us-west"},
		{"sjc", "us-west"}, {"fra", "eu-central"}, {"ams", "eu-west"}, {"lhr", "eu-west"},
		{"cdg", "eu-west"}, {"nrt", "ap-northeast"}, {"sin", "ap-southeast"}, {"syd", "ap-southeast"},
		{"gru", "sa-east"},
	}
	simCountries = []struct {
		code, name, region, city string
		lat, lon                 float64
		asn                      int64
		org                      string
	}{
		{"US", "United States", "VA", "Ashburn", 39.04, -77.49, 7922, "Comcast Cable"},
		{"US", "United States", "CA", "San Jose", 37.34, -121.89, 701, "Verizon Business"},
		{"DE", "Germany", "HE", "Frankfurt", 50.11, 8.68, 3320, "Deutsche Telekom AG"},
		{"GB", "United Kingdom", "ENG", "London", 51.51, -0.13, 2856, "British Telecommunications"},
		{"FR", "France", "IDF", "Paris", 48.86, 2.35, 3215, "Orange S.A."},
		{"JP", "Japan", "13", "Tokyo", 35.68, 139.69, 2516, "KDDI Corporation"},
		{"BR", "Brazil", "SP", "Sao Paulo", -23.55, -46.63, 28573, "Claro S.A."},
		{"IN", "India", "MH", "Mumbai", 19.08, 72.88, 55836, "Reliance Jio"},
		{"NL", "Netherlands", "NH", "Amsterdam", 52.37, 4.90, 1136, "KPN B.V."},
		{"AU", "Australia", "NSW", "Sydney", -33.87, 151.21, 1221, "Telstra"},
		{"SG", "Singapore", "01", "Singapore", 1.35, 103.82, 9506, "Singtel"},
		{"CA", "Canada", "ON", "Toronto", 43.65, -79.38, 812, "Rogers Communications"},
	}
	simPaths = []struct{ path, ext, ctype string }{
		{"/", "", "text/html; charset=utf-8"},
		{"/index.html", "html", "text/html; charset=utf-8"},
		{"/products/widget-42", "", "text/html; charset=utf-8"},
		{"/static/js/app.3f9a1c.js", "js", "application/javascript"},
		{"/static/css/site.8b21e0.css", "css", "text/css"},
		{"/images/hero.webp", "webp", "image/webp"},
		{"/images/logo.svg", "svg", "image/svg+xml"},
		{"/api/v2/cart", "", "application/json"},
		{"/api/v2/search", "", "application/json"},
		{"/video/intro/seg-00017.m4s", "m4s", "video/iso.segment"},
		{"/fonts/inter-var.woff2", "woff2", "font/woff2"},
		{"/favicon.ico", "ico", "image/x-icon"},
	}
	simAgents = []string{
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_6) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
		"Mozilla/5.0 (X11; Linux x86_64; rv:132.0) Gecko/20100101 Firefox/132.0",
		"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
		"curl/8.5.0",
		"okhttp/4.12.0",
	}
	simMethods    = []string{"GET", "GET", "GET", "GET", "GET", "GET", "GET", "HEAD", "POST", "POST", "PUT", "OPTIONS"}
	simStatuses   = []int64{200, 200, 200, 200, 200, 200, 200, 200, 200, 204, 206, 301, 302, 304, 304, 403, 404, 404, 429, 500, 502, 503}
	simCache      = []string{"TCP_HIT", "TCP_HIT", "TCP_HIT", "TCP_HIT", "TCP_MISS", "TCP_MISS", "TCP_EXPIRED_HIT", "TCP_REFRESH_MISS", "TCP_PARTIAL_HIT", "CONFIG_NOCACHE", "UNCACHEABLE"}
	simTLS        = []string{"TLSv1.3", "TLSv1.3", "TLSv1.3", "TLSv1.2"}
	simCiphers    = []string{"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "ECDHE-RSA-AES128-GCM-SHA256"}
	simLanguages  = []string{"en-US,en;q=0.9", "de-DE,de;q=0.9,en;q=0.8", "fr-FR,fr;q=0.9", "ja-JP,ja;q=0.9", "pt-BR,pt;q=0.9"}
	simReferers   = []string{"", "https://www.google.com/", "https://duckduckgo.com/", "https://t.co/", "https://news.ycombinator.com/"}
	simWAFActions = []string{"", "", "", "", "", "", "", "", "alert", "block"}
)

// recordGenerator produces realistic records from a seeded generator. It is
// not safe for concurrent use.
type recordGenerator struct {
	rng *mrand.Rand
}

func newRecordGenerator(seed int64, profileID int64) *recordGenerator {
	return &recordGenerator{rng: mrand.New(mrand.NewPCG(uint64(seed), uint64(profileID)*0x9e3779b97f4a7c15+1))}
}

func pick[T any](r *mrand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

// newUUID returns a random RFC 4122 version-4 UUID. Record UUIDs come from
// crypto/rand, not the seed, so they stay unique across simulator restarts.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// statusAllowed reports whether the status passes a status_codes filter.
func statusAllowed(f *rtldFilters, status int64) bool {
	if f == nil || len(f.StatusCodes) == 0 {
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

func (g *recordGenerator) status(f *rtldFilters) int64 {
	for range 50 {
		if s := pick(g.rng, simStatuses); statusAllowed(f, s) {
			return s
		}
	}
	// The filter names only codes the model rarely produces: use one of them.
	c := pick(g.rng, f.StatusCodes)
	if strings.HasSuffix(c, "xx") {
		return int64(c[0]-'0') * 100
	}
	n, _ := strconv.ParseInt(c, 10, 64)
	return n
}

func (g *recordGenerator) host(rc recordContext) string {
	if f := rc.filters; f != nil && f.HostNames != nil && len(f.HostNames.Names) > 0 {
		if f.HostNames.Condition == "in" {
			return pick(g.rng, f.HostNames.Names)
		}
		var ok []string
		for _, h := range rc.hosts {
			if !slices.Contains(f.HostNames.Names, h) {
				ok = append(ok, h)
			}
		}
		if len(ok) == 0 {
			return "unlisted." + rc.hosts[0]
		}
		return pick(g.rng, ok)
	}
	return pick(g.rng, rc.hosts)
}

// record generates one record of the shape at time now.
func (g *recordGenerator) record(shape recordShape, rc recordContext, now time.Time) logRecord {
	r := g.rng
	status := g.status(rc.filters)
	p := pick(r, simPaths)
	c := pick(r, simCountries)
	pop := pick(r, simPops)
	method := pick(r, simMethods)
	cache := pick(r, simCache)
	origin := pick(r, rc.origins)
	host := g.host(rc)
	ipv6 := r.IntN(5) == 0
	clientIP := fmt.Sprintf("%d.%d.%d.%d", 1+r.IntN(222), r.IntN(256), r.IntN(256), 1+r.IntN(254))
	if ipv6 {
		clientIP = fmt.Sprintf("2001:db8:%x:%x::%x", r.IntN(0xffff), r.IntN(0xffff), 1+r.IntN(0xfffe))
	}
	var bytesOut int64
	switch {
	case status == 204 || status == 304 || method == "HEAD":
		bytesOut = 180 + r.Int64N(240)
	case status >= 300:
		bytesOut = 300 + r.Int64N(900)
	default:
		bytesOut = int64(math.Exp(7 + 3.5*r.Float64()))
	}
	bytesIn := 250 + r.Int64N(1500)
	if method == "POST" || method == "PUT" {
		bytesIn += r.Int64N(20000)
	}
	hit := strings.Contains(cache, "HIT")
	ttfb := 0.002 + 0.03*r.ExpFloat64()
	originTime := 0.0
	if !hit {
		originTime = 0.02 + 0.15*r.ExpFloat64()
	}
	total := ttfb + originTime + float64(bytesOut)/5e7
	query := ""
	if r.IntN(4) == 0 {
		query = fmt.Sprintf("v=%d&utm_source=%s", r.IntN(100), pick(r, []string{"newsletter", "ads", "social"}))
	}
	// A record's timestamp lies up to two seconds before it is batched.
	ts := now.Add(-time.Duration(r.Int64N(int64(2 * time.Second))))
	id := newUUID()

	vals := make([]any, len(shape.keys))
	for i, k := range shape.keys {
		if name, ok := shape.custom[i]; ok {
			vals[i] = g.customValue(k, name)
			continue
		}
		var v any
		switch k {
		case "timestamp":
			v = json.Number(strconv.FormatFloat(float64(ts.UnixMicro())/1e6, 'f', 6, 64))
		case "uuid":
			v = id
		case "account_number":
			v = rc.accountNumber
		case "environment_id":
			v = rc.environmentID
		case "status_code":
			v = status
		case "method":
			v = method
		case "scheme":
			v = "https"
		case "proto":
			v = pick(r, []string{"HTTP/2.0", "HTTP/2.0", "HTTP/1.1", "HTTP/3"})
		case "host", "client_tls_sni":
			v = host
		case "path":
			v = p.path
		case "query":
			v = query
		case "rewritten_path":
			v = p.path
		case "file_ext":
			v = p.ext
		case "referer":
			v = pick(r, simReferers)
		case "user_agent":
			v = pick(r, simAgents)
		case "accept_encoding":
			v = pick(r, []string{"gzip, deflate, br", "gzip, deflate, br, zstd", "gzip", ""})
		case "accept_language":
			v = pick(r, simLanguages)
		case "range":
			v = ""
			if status == 206 {
				v = fmt.Sprintf("bytes=%d-", r.IntN(1<<20))
			}
		case "x_forwarded_for":
			v = ""
			if r.IntN(10) == 0 {
				v = fmt.Sprintf("10.%d.%d.%d", r.IntN(256), r.IntN(256), 1+r.IntN(254))
			}
		case "client_ip":
			v = clientIP
		case "client_port":
			v = int64(1024 + r.IntN(64511))
		case "client_ip_version":
			v = map[bool]string{true: "IPv6", false: "IPv4"}[ipv6]
		case "client_country_code":
			v = c.code
		case "client_country":
			v = c.name
		case "client_region":
			v = c.region
		case "client_city":
			v = c.city
		case "client_geo_latitude":
			v = math.Round((c.lat+r.Float64()-0.5)*1e4) / 1e4
		case "client_geo_longitude":
			v = math.Round((c.lon+r.Float64()-0.5)*1e4) / 1e4
		case "client_asn":
			v = c.asn
		case "client_as_org":
			v = c.org
		case "client_tls_version":
			v = pick(r, simTLS)
		case "client_tls_cipher":
			v = pick(r, simCiphers)
		case "client_tls_ja3_md5":
			v = fmt.Sprintf("%016x%016x", r.Uint64(), r.Uint64())
		case "bytes_in":
			v = bytesIn
		case "bytes_out":
			v = bytesOut
		case "request_body_bytes":
			v = max(0, bytesIn-250)
		case "response_body_bytes":
			v = max(0, bytesOut-180)
		case "content_type":
			v = p.ctype
		case "content_encoding":
			v = ""
			if strings.HasPrefix(p.ctype, "text/") || strings.Contains(p.ctype, "javascript") || strings.Contains(p.ctype, "json") {
				v = pick(r, []string{"br", "gzip"})
			}
		case "cache_control":
			v = pick(r, []string{"public, max-age=31536000, immutable", "public, max-age=300", "no-store", "private, max-age=0"})
		case "location":
			v = ""
			if status == 301 || status == 302 {
				v = "https://" + host + p.path + "/"
			}
		case "cache_status":
			v = cache
		case "cache_key":
			v = host + p.path
		case "cacheable":
			v = map[bool]string{true: "true", false: "false"}[cache != "UNCACHEABLE" && cache != "CONFIG_NOCACHE"]
		case "prefetch":
			v = map[bool]string{true: "true", false: "false"}[r.IntN(40) == 0]
		case "pop":
			v = pop.code
		case "edge_region":
			v = pop.region
		case "server_ip":
			v = fmt.Sprintf("192.0.2.%d", 1+r.IntN(254))
		case "server_port":
			v = int64(443)
		case "origin_name":
			v = origin
		case "origin_ip":
			v = ""
			if !hit {
				v = fmt.Sprintf("198.51.100.%d", 1+r.IntN(254))
			}
		case "origin_status_code":
			v = int64(0)
			if !hit {
				v = status
			}
		case "origin_time":
			v = round6(originTime)
		case "origin_ttfb":
			v = round6(originTime * 0.8)
		case "total_time":
			v = round6(total)
		case "time_to_first_byte":
			v = round6(ttfb + originTime*0.8)
		case "prewrite_time":
			v = round6(ttfb * 0.7)
		case "tcp_rtt":
			v = int64(2 + r.IntN(180))
		case "edge_function_time":
			v = round6(0.0005 * r.ExpFloat64())
		case "image_optimized":
			v = map[bool]string{true: "true", false: "false"}[strings.HasPrefix(p.ctype, "image/") && r.IntN(2) == 0]
		case "waf_action":
			v = pick(r, simWAFActions)
		case "waf_rule_id", "waf_event_id":
			v = ""
			if r.IntN(12) == 0 {
				v = strconv.Itoa(900000 + r.IntN(99999))
			}
		case "rate_limit_action":
			v = ""
			if status == 429 {
				v = "block"
			}
		case "bot_action":
			v = pick(r, []string{"", "", "", "", "allow", "challenge"})
		case "bot_score":
			v = int64(1 + r.IntN(99))
		case "is_bot":
			v = map[bool]string{true: "true", false: "false"}[r.IntN(8) == 0]
		case "redirect_url":
			v = ""
			if status == 301 || status == 302 {
				v = "https://" + host + p.path + "/"
			}
		case "error_message":
			v = ""
			if status >= 500 {
				v = pick(r, []string{"origin connect timeout", "origin returned 5xx", "upstream reset"})
			}
		default:
			v = g.byType(k)
		}
		vals[i] = v
	}
	return logRecord{uuid: id, values: vals}
}

// byType produces a value for a catalogued code the switch above does not
// know (a code added to the catalogue later).
func (g *recordGenerator) byType(code string) any {
	t, _ := accesslog.FieldTypeOf(code)
	switch t {
	case accesslog.TypeInteger:
		return g.rng.Int64N(1000)
	case accesslog.TypeFloat:
		return round6(g.rng.Float64())
	case accesslog.TypeTimestamp:
		return json.Number(strconv.FormatFloat(float64(time.Now().UnixMicro())/1e6, 'f', 6, 64))
	}
	return fmt.Sprintf("%s-%d", code, g.rng.IntN(100))
}

func (g *recordGenerator) customValue(key, name string) string {
	r := g.rng
	switch strings.ToLower(name) {
	case "x-request-id", "x-correlation-id":
		return fmt.Sprintf("%016x", r.Uint64())
	case "x-device-type":
		return pick(r, []string{"desktop", "mobile", "tablet"})
	case "content-language":
		return pick(r, []string{"en", "de", "fr", "ja"})
	case "x-cache":
		return pick(r, []string{"HIT", "MISS"})
	}
	switch {
	case strings.HasPrefix(key, accesslog.CookiePrefix):
		if r.IntN(4) == 0 {
			return ""
		}
		return fmt.Sprintf("%08x%08x", r.Uint32(), r.Uint32())
	case r.IntN(5) == 0:
		return ""
	}
	return fmt.Sprintf("%s-%d", strings.ToLower(name), r.IntN(1000))
}

func round6(x float64) float64 { return math.Round(x*1e6) / 1e6 }

// batchHeader is the identity of a json-format batch.
type batchHeader struct {
	AccountNumber string
	AgentID       string
	Datestamp     string
	ProfileID     int64
	SeqNum        int64
}

// encodeBatch renders records in the profile's log format and gzips them.
// It returns the compressed body and its Content-Type.
func encodeBatch(format string, h batchHeader, keys []string, recs []logRecord) ([]byte, string, error) {
	var raw bytes.Buffer
	ctype := "application/json"
	switch format {
	case formatJSON:
		raw.WriteString(`{"account_number":`)
		appendJSONString(&raw, h.AccountNumber)
		raw.WriteString(`,"agent_id":`)
		appendJSONString(&raw, h.AgentID)
		raw.WriteString(`,"datestamp":`)
		appendJSONString(&raw, h.Datestamp)
		raw.WriteString(`,"platform":`)
		appendJSONString(&raw, deliveryPlatform)
		fmt.Fprintf(&raw, `,"profile_id":%d,"seq_num":%d,"logs":[`, h.ProfileID, h.SeqNum)
		for i, rec := range recs {
			if i > 0 {
				raw.WriteByte(',')
			}
			appendRecord(&raw, keys, rec)
		}
		raw.WriteString("]}")
	case formatJSONArray:
		raw.WriteByte('[')
		for i, rec := range recs {
			if i > 0 {
				raw.WriteByte(',')
			}
			appendRecord(&raw, keys, rec)
		}
		raw.WriteByte(']')
	case formatJSONLines:
		ctype = "application/x-ndjson"
		for _, rec := range recs {
			appendRecord(&raw, keys, rec)
			raw.WriteByte('\n')
		}
	case formatCSV:
		ctype = "text/csv"
		w := csv.NewWriter(&raw)
		_ = w.Write(keys)
		row := make([]string, len(keys))
		for _, rec := range recs {
			for i, v := range rec.values {
				row[i] = csvValue(v)
			}
			_ = w.Write(row)
		}
		w.Flush()
		if err := w.Error(); err != nil {
			return nil, "", fmt.Errorf("encode csv batch: %w", err)
		}
	default:
		return nil, "", fmt.Errorf("unsupported log format %q", format)
	}
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.DefaultCompression)
	if err != nil {
		return nil, "", fmt.Errorf("gzip batch: %w", err)
	}
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, "", fmt.Errorf("gzip batch: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, "", fmt.Errorf("gzip batch: %w", err)
	}
	return out.Bytes(), ctype, nil
}

func appendRecord(b *bytes.Buffer, keys []string, rec logRecord) {
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		appendJSONString(b, k)
		b.WriteByte(':')
		switch v := rec.values[i].(type) {
		case string:
			appendJSONString(b, v)
		case int64:
			b.WriteString(strconv.FormatInt(v, 10))
		case float64:
			b.WriteString(strconv.FormatFloat(v, 'f', -1, 64))
		case json.Number:
			b.WriteString(string(v))
		default:
			enc, _ := json.Marshal(v)
			b.Write(enc)
		}
	}
	b.WriteByte('}')
}

func csvValue(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case json.Number:
		return string(v)
	}
	return fmt.Sprint(v)
}

// appendJSONString writes s as a JSON string, taking a fast path for plain
// printable ASCII.
func appendJSONString(b *bytes.Buffer, s string) {
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			plain = false
			break
		}
	}
	if plain {
		b.WriteByte('"')
		b.WriteString(s)
		b.WriteByte('"')
		return
	}
	enc, _ := json.Marshal(s)
	b.Write(enc)
}
