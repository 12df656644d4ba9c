package accesslog

// This file is the catalogue of RTLD access-log field codes: the codes the
// platform's `GET /rtld/v1/accesslogs/fields` lists, their display names, and
// the value type each carries in a delivered record. The platform simulator
// serves it, and the receiver's sinks use it to give known fields typed
// storage (for example ClickHouse columns). Codes not in the catalogue (a
// newer platform, custom header and cookie fields) are valid in records;
// callers should keep them untyped.

import "strings"

// FieldType is the JSON value type a field carries in a delivered record.
type FieldType string

const (
	// TypeString is a JSON string.
	TypeString FieldType = "string"
	// TypeInteger is a JSON number without fraction (fits in int64).
	TypeInteger FieldType = "integer"
	// TypeFloat is a JSON number that may carry a fraction (durations in
	// seconds, coordinates, scores).
	TypeFloat FieldType = "float"
	// TypeTimestamp is Unix time in seconds with a fraction, as a JSON number
	// (for example 1523916295.768957), always UTC.
	TypeTimestamp FieldType = "timestamp"
)

// Field describes one log-field code.
type Field struct {
	// Code is the key of the field in a record and the value a profile's
	// `fields` list uses.
	Code string `json:"code"`
	// Name is the human-readable name the fields API returns.
	Name string `json:"name"`
	// Type is the value type of the field in a record.
	Type FieldType `json:"-"`
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
	{"timestamp", "Timestamp", TypeTimestamp},
	{"uuid", "Request UUID", TypeString},
	{"account_number", "Account Number", TypeString},
	{"environment_id", "Environment ID", TypeString},
	{"status_code", "Status Code", TypeInteger},
	{"method", "HTTP Method", TypeString},
	{"scheme", "Scheme", TypeString},
	{"proto", "Protocol Version", TypeString},
	{"host", "Host", TypeString},
	{"path", "Path", TypeString},
	{"query", "Query String", TypeString},
	{"rewritten_path", "Rewritten Path", TypeString},
	{"file_ext", "File Extension", TypeString},
	{"referer", "Referer", TypeString},
	{"user_agent", "User Agent", TypeString},
	{"accept_encoding", "Accept-Encoding Request Header", TypeString},
	{"accept_language", "Accept-Language Request Header", TypeString},
	{"range", "Range Request Header", TypeString},
	{"x_forwarded_for", "X-Forwarded-For Request Header", TypeString},
	{"client_ip", "Client IP", TypeString},
	{"client_port", "Client Port", TypeInteger},
	{"client_ip_version", "Client IP Version", TypeString},
	{"client_country_code", "Client Country Code", TypeString},
	{"client_country", "Client Country", TypeString},
	{"client_region", "Client Region", TypeString},
	{"client_city", "Client City", TypeString},
	{"client_geo_latitude", "Client Latitude", TypeFloat},
	{"client_geo_longitude", "Client Longitude", TypeFloat},
	{"client_asn", "Client ASN", TypeInteger},
	{"client_as_org", "Client AS Organization", TypeString},
	{"client_tls_version", "Client TLS Version", TypeString},
	{"client_tls_cipher", "Client TLS Cipher", TypeString},
	{"client_tls_ja3_md5", "Client TLS JA3 Fingerprint", TypeString},
	{"client_tls_sni", "Client TLS SNI", TypeString},
	{"bytes_in", "Bytes In", TypeInteger},
	{"bytes_out", "Bytes Out", TypeInteger},
	{"request_body_bytes", "Request Body Bytes", TypeInteger},
	{"response_body_bytes", "Response Body Bytes", TypeInteger},
	{"content_type", "Content-Type Response Header", TypeString},
	{"content_encoding", "Content-Encoding Response Header", TypeString},
	{"cache_control", "Cache-Control Response Header", TypeString},
	{"location", "Location Response Header", TypeString},
	{"cache_status", "Cache Status", TypeString},
	{"cache_key", "Cache Key", TypeString},
	{"cacheable", "Cacheable", TypeString},
	{"prefetch", "Prefetch", TypeString},
	{"pop", "POP", TypeString},
	{"edge_region", "Edge Region", TypeString},
	{"server_ip", "Server IP", TypeString},
	{"server_port", "Server Port", TypeInteger},
	{"origin_name", "Origin Name", TypeString},
	{"origin_ip", "Origin IP", TypeString},
	{"origin_status_code", "Origin Status Code", TypeInteger},
	{"origin_time", "Origin Response Time", TypeFloat},
	{"origin_ttfb", "Origin Time to First Byte", TypeFloat},
	{"total_time", "Total Time", TypeFloat},
	{"time_to_first_byte", "Time to First Byte", TypeFloat},
	{"prewrite_time", "Pre-write Time", TypeFloat},
	{"tcp_rtt", "TCP Round-Trip Time (ms)", TypeInteger},
	{"edge_function_time", "Edge Function Time", TypeFloat},
	{"image_optimized", "Image Optimized", TypeString},
	{"waf_action", "WAF Action", TypeString},
	{"waf_rule_id", "WAF Rule ID", TypeString},
	{"waf_event_id", "WAF Event ID", TypeString},
	{"rate_limit_action", "Rate Limit Action", TypeString},
	{"bot_action", "Bot Action", TypeString},
	{"bot_score", "Bot Score", TypeInteger},
	{"is_bot", "Is Bot", TypeString},
	{"redirect_url", "Redirect URL", TypeString},
	{"error_message", "Error Message", TypeString},
}

var byCode = func() map[string]int {
	m := make(map[string]int, len(catalogue))
	for i, f := range catalogue {
		m[f.Code] = i
	}
	return m
}()

// Fields returns the catalogue in the order the fields API lists it. The slice
// is a copy the caller may modify.
func Fields() []Field {
	out := make([]Field, len(catalogue))
	copy(out, catalogue)
	return out
}

// FieldCodes returns every catalogued code in catalogue order.
func FieldCodes() []string {
	out := make([]string, len(catalogue))
	for i, f := range catalogue {
		out[i] = f.Code
	}
	return out
}

// LookupField returns the catalogued field with the code.
func LookupField(code string) (Field, bool) {
	i, ok := byCode[code]
	if !ok {
		return Field{}, false
	}
	return catalogue[i], true
}

// FieldTypeOf returns the value type of a record key: the catalogue's type for a
// known code, TypeString for custom header and cookie fields, and false for any
// other key (keep it untyped).
func FieldTypeOf(code string) (FieldType, bool) {
	if f, ok := LookupField(code); ok {
		return f.Type, true
	}
	if IsCustomField(code) {
		return TypeString, true
	}
	return "", false
}

// IsCustomField reports whether code names a custom request header, response
// header or cookie field.
func IsCustomField(code string) bool {
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
