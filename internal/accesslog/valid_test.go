package accesslog

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzValid checks that the fast path's validator accepts exactly what
// encoding/json's Valid accepts.
func FuzzValid(f *testing.F) {
	for _, seed := range []string{
		`{}`, `[]`, ` {"a":[1,2.5e-3,-0,"x\u00e9\n",true,false,null,{}]} `, `{"a":1,}`, `[1,]`, `01`, `-`, `1.`, `1e`, `1e+`,
		`"\x"`, `"\u12g4"`, "\"a\x01\"", `{"a" 1}`, `{"a":1 "b":2}`, `[1 2]`, `tru`, `nul`, `{"a":[}`, `]`, `"`, `{"\"":1}`,
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001), strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000), `{"logs":[{"a":"b"}],"seq_num":1}`, "\xff", `"\xff"`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validJSON([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Fatalf("validJSON(%q) = %v, encoding/json says %v", s, got, want)
		}
	})
}

func BenchmarkValid(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"seq_num":1,"logs":[`)
	for i := range 500 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"uuid":"0f6c2a9e-3333-4b1d-8f6e-00000000fa17","timestamp":1763856000.123456,"status_code":200,"path":"/a/b/c?d=e\u0026f","ua":"Mozilla/5.0 (X11; Linux x86_64)","bytes_out":12345,"ratio":0.25,"cache":"HIT"}`)
	}
	sb.WriteString("]}")
	body := []byte(sb.String())
	b.Run("encoding/json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			json.Valid(body)
		}
	})
	b.Run("validJSON", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			validJSON(body)
		}
	})
	b.Run("DecodeBytes", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := DecodeBytes("env", body); err != nil {
				b.Fatal(err)
			}
		}
	})
}
