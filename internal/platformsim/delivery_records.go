package platformsim

import (
	"bytes"
	"crypto/rand"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
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
	bucket int64 // start of the record's FIVE_MINUTES bucket, Unix seconds
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
	originW       []float64 // traffic share of each origin
	filters       *rtldFilters
}

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
