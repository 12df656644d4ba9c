// Package logfield is the catalogue of RTLD access-log field codes: the codes
// the platform's `GET /rtld/v1/accesslogs/fields` lists, their display names,
// and the value type each carries in a delivered record.
//
// The platform simulator serves this catalogue, and the receiver's sinks use
// it to give known fields typed storage (for example ClickHouse columns).
// Codes not in the catalogue (a newer platform, custom header and cookie
// fields) are valid in records; callers should keep them untyped.
package logfield

import "strings"

// Type is the JSON value type a field carries in a delivered record.
type Type string

const (
	// String is a JSON string.
	String Type = "string"
	// Integer is a JSON number without fraction (fits in int64).
	Integer Type = "integer"
	// Float is a JSON number that may carry a fraction (durations in
	// seconds, coordinates, scores).
	Float Type = "float"
	// Timestamp is Unix time in seconds with a fraction, as a JSON number
	// (for example 1523916295.768957), always UTC.
	Timestamp Type = "timestamp"
)

// Field describes one log-field code.
type Field struct {
	// Code is the key of the field in a record and the value a profile's
	// `fields` list uses.
	Code string `json:"code"`
	// Name is the human-readable name the fields API returns.
	Name string `json:"name"`
	// Type is the value type of the field in a record.
	Type Type `json:"-"`
}

// Prefixes of the fields the platform adds for a profile's custom request
// headers, response headers and cookies.
const (
	RequestHeaderPrefix  = "req_hdr_"
	ResponseHeaderPrefix = "resp_hdr_"
	CookiePrefix         = "cookie_"
)

// catalogue is the list in the order the fields API returns it. It is never
// modified after package initialisation.
var catalogue = []Field{
	{"timestamp", "Timestamp", Timestamp},
	{"uuid", "Request UUID", String},
	{"account_number", "Account Number", String},
	{"environment_id", "Environment ID", String},
	{"status_code", "Status Code", Integer},
	{"method", "HTTP Method", String},
	{"scheme", "Scheme", String},
	{"proto", "Protocol Version", String},
	{"host", "Host", String},
	{"path", "Path", String},
	{"query", "Query String", String},
	{"rewritten_path", "Rewritten Path", String},
	{"file_ext", "File Extension", String},
	{"referer", "Referer", String},
	{"user_agent", "User Agent", String},
	{"accept_encoding", "Accept-Encoding Request Header", String},
	{"accept_language", "Accept-Language Request Header", String},
	{"range", "Range Request Header", String},
	{"x_forwarded_for", "X-Forwarded-For Request Header", String},
	{"client_ip", "Client IP", String},
	{"client_port", "Client Port", Integer},
	{"client_ip_version", "Client IP Version", String},
	{"client_country_code", "Client Country Code", String},
	{"client_country", "Client Country", String},
	{"client_region", "Client Region", String},
	{"client_city", "Client City", String},
	{"client_geo_latitude", "Client Latitude", Float},
	{"client_geo_longitude", "Client Longitude", Float},
	{"client_asn", "Client ASN", Integer},
	{"client_as_org", "Client AS Organization", String},
	{"client_tls_version", "Client TLS Version", String},
	{"client_tls_cipher", "Client TLS Cipher", String},
	{"client_tls_ja3_md5", "Client TLS JA3 Fingerprint", String},
	{"client_tls_sni", "Client TLS SNI", String},
	{"bytes_in", "Bytes In", Integer},
	{"bytes_out", "Bytes Out", Integer},
	{"request_body_bytes", "Request Body Bytes", Integer},
	{"response_body_bytes", "Response Body Bytes", Integer},
	{"content_type", "Content-Type Response Header", String},
	{"content_encoding", "Content-Encoding Response Header", String},
	{"cache_control", "Cache-Control Response Header", String},
	{"location", "Location Response Header", String},
	{"cache_status", "Cache Status", String},
	{"cache_key", "Cache Key", String},
	{"cacheable", "Cacheable", String},
	{"prefetch", "Prefetch", String},
	{"pop", "POP", String},
	{"edge_region", "Edge Region", String},
	{"server_ip", "Server IP", String},
	{"server_port", "Server Port", Integer},
	{"origin_name", "Origin Name", String},
	{"origin_ip", "Origin IP", String},
	{"origin_status_code", "Origin Status Code", Integer},
	{"origin_time", "Origin Response Time", Float},
	{"origin_ttfb", "Origin Time to First Byte", Float},
	{"total_time", "Total Time", Float},
	{"time_to_first_byte", "Time to First Byte", Float},
	{"prewrite_time", "Pre-write Time", Float},
	{"tcp_rtt", "TCP Round-Trip Time (ms)", Integer},
	{"edge_function_time", "Edge Function Time", Float},
	{"image_optimized", "Image Optimized", String},
	{"waf_action", "WAF Action", String},
	{"waf_rule_id", "WAF Rule ID", String},
	{"waf_event_id", "WAF Event ID", String},
	{"rate_limit_action", "Rate Limit Action", String},
	{"bot_action", "Bot Action", String},
	{"bot_score", "Bot Score", Integer},
	{"is_bot", "Is Bot", String},
	{"redirect_url", "Redirect URL", String},
	{"error_message", "Error Message", String},
}

var byCode = func() map[string]int {
	m := make(map[string]int, len(catalogue))
	for i, f := range catalogue {
		m[f.Code] = i
	}
	return m
}()

// All returns the catalogue in the order the fields API lists it. The slice
// is a copy the caller may modify.
func All() []Field {
	out := make([]Field, len(catalogue))
	copy(out, catalogue)
	return out
}

// Codes returns every catalogued code in catalogue order.
func Codes() []string {
	out := make([]string, len(catalogue))
	for i, f := range catalogue {
		out[i] = f.Code
	}
	return out
}

// Lookup returns the catalogued field with the code.
func Lookup(code string) (Field, bool) {
	i, ok := byCode[code]
	if !ok {
		return Field{}, false
	}
	return catalogue[i], true
}

// TypeOf returns the value type of a record key: the catalogue's type for a
// known code, String for custom header and cookie fields, and false for any
// other key (keep it untyped).
func TypeOf(code string) (Type, bool) {
	if f, ok := Lookup(code); ok {
		return f.Type, true
	}
	if IsCustom(code) {
		return String, true
	}
	return "", false
}

// IsCustom reports whether code names a custom request header, response
// header or cookie field.
func IsCustom(code string) bool {
	return strings.HasPrefix(code, RequestHeaderPrefix) ||
		strings.HasPrefix(code, ResponseHeaderPrefix) ||
		strings.HasPrefix(code, CookiePrefix)
}

// RequestHeaderField returns the record key of a custom request header:
// `req_hdr_` followed by the header name in lowercase with hyphens as
// underscores (X-Request-Id → req_hdr_x_request_id).
func RequestHeaderField(header string) string { return RequestHeaderPrefix + normalize(header) }

// ResponseHeaderField returns the record key of a custom response header
// (`resp_hdr_<name>`, normalised as in RequestHeaderField).
func ResponseHeaderField(header string) string { return ResponseHeaderPrefix + normalize(header) }

// CookieField returns the record key of a custom cookie (`cookie_<name>`,
// normalised as in RequestHeaderField).
func CookieField(cookie string) string { return CookiePrefix + normalize(cookie) }

func normalize(name string) string {
	return strings.ReplaceAll(strings.ToLower(name), "-", "_")
}
