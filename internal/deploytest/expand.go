package deploytest

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Values is what Grafana substitutes into a query when a dashboard runs: the
// time range, the intervals it derives, and the template variables' current
// values.
type Values struct {
	From, To     time.Time
	Interval     time.Duration // $__interval
	RateInterval time.Duration // $__rate_interval (Prometheus)
	// Vars holds each template variable's selected values; a variable in All
	// is expanded to its allValue when it has one, else to all its values.
	Vars map[string][]string
	// All lists the variables whose "All" option is selected.
	All map[string]bool
}

// Expand substitutes the dashboard's variables, Grafana's built-in variables
// and, for ClickHouse SQL, the grafana-clickhouse-datasource macros into q,
// the way Grafana and the plugin do before a query reaches the server. It
// fails on a reference to an unknown variable or macro, so a typo in a
// dashboard cannot hide behind a query that still parses.
func Expand(d Dashboard, q Query, v Values) (string, error) {
	s := q.Text
	var err error
	if q.Language == ClickHouseSQL {
		// The plugin resolves $__conditionalAll before Grafana interpolates.
		if s, err = expandMacro(s, "$__conditionalAll", func(args []string) (string, error) {
			if len(args) != 2 {
				return "", fmt.Errorf("$__conditionalAll wants 2 arguments, got %d", len(args))
			}
			name, ok := variableReference(strings.TrimSpace(args[1]))
			if !ok {
				return "", fmt.Errorf("$__conditionalAll second argument %q is not a variable", args[1])
			}
			if v.All[name] {
				return "1=1", nil
			}
			return args[0], nil
		}); err != nil {
			return "", err
		}
	}
	if s, err = interpolate(d, q, s, v); err != nil {
		return "", err
	}
	if q.Language == ClickHouseSQL {
		if s, err = clickHouseMacros(s, v); err != nil {
			return "", err
		}
	}
	if i := strings.Index(s, "$"); i >= 0 && q.Language == PromQL {
		return "", fmt.Errorf("unexpanded %q in %s", s[i:min(len(s), i+20)], s)
	}
	if i := strings.Index(s, "$__"); i >= 0 {
		return "", fmt.Errorf("unknown macro %q", s[i:min(len(s), i+20)])
	}
	return s, nil
}

// variableToken matches ${name}, ${name:format}, [[name]] and $name.
var variableToken = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::([A-Za-z]+))?\}|\[\[([A-Za-z0-9_]+)(?::([A-Za-z]+))?\]\]|\$([A-Za-z0-9_]+)`)

// interpolate replaces template and built-in variables (Grafana's template
// service). ClickHouse macros (names followed by "(") are left alone.
func interpolate(d Dashboard, q Query, s string, v Values) (string, error) {
	var firstErr error
	out := variableToken.ReplaceAllStringFunc(s, func(tok string) string {
		m := variableToken.FindStringSubmatch(tok)
		var name, format string
		switch {
		case m[1] != "":
			name, format = m[1], m[2]
		case m[3] != "":
			name, format = m[3], m[4]
		default:
			name = m[5]
		}
		if strings.HasPrefix(name, "__") {
			val, ok := builtin(name, v)
			if !ok {
				return tok // a macro, or unknown: Expand reports leftovers
			}
			return val
		}
		r, err := variableValue(d, q, name, format, v)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return r
	})
	return out, firstErr
}

// builtin returns Grafana's global variables.
func builtin(name string, v Values) (string, bool) {
	rng := v.To.Sub(v.From)
	switch name {
	case "__interval":
		return promDuration(v.Interval), true
	case "__interval_ms":
		return strconv.FormatInt(v.Interval.Milliseconds(), 10), true
	case "__rate_interval":
		return promDuration(v.RateInterval), true
	case "__range":
		return promDuration(rng), true
	case "__range_s":
		return strconv.FormatInt(int64(rng.Seconds()), 10), true
	case "__range_ms":
		return strconv.FormatInt(rng.Milliseconds(), 10), true
	case "__from":
		return strconv.FormatInt(v.From.UnixMilli(), 10), true
	case "__to":
		return strconv.FormatInt(v.To.UnixMilli(), 10), true
	}
	return "", false
}

// promDuration formats d as Prometheus and Grafana write durations: the
// largest unit that divides it (1h, 5m, 90s).
func promDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "1s"
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// variableValue formats a template variable as Grafana would for the query's
// datasource.
func variableValue(d Dashboard, q Query, name, format string, v Values) (string, error) {
	def, ok := d.Variable(name)
	if !ok {
		return "", fmt.Errorf("unknown variable $%s", name)
	}
	if def.Type == "datasource" {
		return "", fmt.Errorf("datasource variable $%s used inside a query", name)
	}
	vals, ok := v.Vars[name]
	if !ok {
		return "", fmt.Errorf("no value given for $%s", name)
	}
	all := v.All[name]
	multi := def.Multi || def.IncludeAll
	if all && def.AllValue != "" && format == "" {
		return def.AllValue, nil
	}
	switch format {
	case "raw", "text":
		return strings.Join(vals, ","), nil
	case "csv":
		return strings.Join(vals, ","), nil
	case "pipe":
		return strings.Join(vals, "|"), nil
	case "regex":
		return regexAlternation(vals), nil
	case "singlequote":
		return quoteEach(vals, "'"), nil
	case "doublequote":
		return quoteEach(vals, `"`), nil
	case "sqlstring":
		return quoteEach(vals, "'"), nil
	case "":
	default:
		return "", fmt.Errorf("unsupported format ${%s:%s}", name, format)
	}
	switch q.Language {
	case PromQL:
		if multi {
			return regexAlternation(vals), nil
		}
		if len(vals) != 1 {
			return "", fmt.Errorf("single-value $%s has %d values", name, len(vals))
		}
		return strings.ReplaceAll(vals[0], `\`, `\\`), nil
	default:
		// SQL has no regex matcher: a multi-value variable needs an explicit
		// format (${var:singlequote}) or its values run together.
		if multi {
			return "", fmt.Errorf("multi-value $%s in SQL needs a format such as ${%s:singlequote}", name, name)
		}
		if len(vals) != 1 {
			return "", fmt.Errorf("single-value $%s has %d values", name, len(vals))
		}
		return vals[0], nil
	}
}

// regexAlternation is Grafana's Prometheus formatting of several values:
// (a|b) with regex metacharacters escaped.
func regexAlternation(vals []string) string {
	esc := make([]string, len(vals))
	for i, s := range vals {
		esc[i] = strings.ReplaceAll(regexp.QuoteMeta(s), `\`, `\\`)
	}
	if len(esc) == 1 {
		return esc[0]
	}
	return "(" + strings.Join(esc, "|") + ")"
}

func quoteEach(vals []string, q string) string {
	out := make([]string, len(vals))
	for i, s := range vals {
		out[i] = q + strings.ReplaceAll(s, q, `\`+q) + q
	}
	return strings.Join(out, ",")
}

// clickHouseMacros expands the grafana-clickhouse-datasource macros with the
// same output as the plugin's backend (pkg/macros).
func clickHouseMacros(s string, v Values) (string, error) {
	from, to := v.From.UTC().Unix(), v.To.UTC().Unix()
	secs := max(int64(v.Interval.Seconds()), 1)
	fns := []struct {
		name string
		fn   func(args []string) (string, error)
	}{
		{"$__timeFilter_ms", func(_ []string) (string, error) {
			return "", errors.New("$__timeFilter_ms needs DateTime64 (ClickHouse >= 20.1): use $__timeFilter")
		}},
		{"$__timeFilter", func(a []string) (string, error) {
			if len(a) != 1 {
				return "", fmt.Errorf("$__timeFilter wants 1 argument, got %d", len(a))
			}
			c := strings.TrimSpace(a[0])
			return fmt.Sprintf("%s >= toDateTime(%d) AND %s <= toDateTime(%d)", c, from, c, to), nil
		}},
		{"$__dateFilter", func(a []string) (string, error) {
			if len(a) != 1 {
				return "", fmt.Errorf("$__dateFilter wants 1 argument, got %d", len(a))
			}
			c := strings.TrimSpace(a[0])
			return fmt.Sprintf("%s >= toDate('%s') AND %s <= toDate('%s')", c, v.From.UTC().Format(time.DateOnly), c, v.To.UTC().Format(time.DateOnly)), nil
		}},
		{"$__timeInterval_ms", func(_ []string) (string, error) {
			return "", errors.New("$__timeInterval_ms needs DateTime64 (ClickHouse >= 20.1)")
		}},
		{"$__timeInterval", func(a []string) (string, error) {
			if len(a) != 1 {
				return "", fmt.Errorf("$__timeInterval wants 1 argument, got %d", len(a))
			}
			return fmt.Sprintf("toStartOfInterval(toDateTime(%s), INTERVAL %d second)", strings.TrimSpace(a[0]), secs), nil
		}},
	}
	var err error
	for _, m := range fns {
		if s, err = expandMacro(s, m.name, m.fn); err != nil {
			return "", err
		}
	}
	// Argument-less macros; the longer names first.
	r := strings.NewReplacer(
		"$__fromTime_ms", fmt.Sprintf("fromUnixTimestamp64Milli(%d)", v.From.UnixMilli()),
		"$__toTime_ms", fmt.Sprintf("fromUnixTimestamp64Milli(%d)", v.To.UnixMilli()),
		"$__fromTime", fmt.Sprintf("toDateTime(%d)", from),
		"$__toTime", fmt.Sprintf("toDateTime(%d)", to),
		"$__interval_s", strconv.FormatInt(secs, 10),
	)
	return r.Replace(s), nil
}

// expandMacro replaces every name(args…) in s with fn(args). Arguments are
// split on top-level commas; parentheses and quotes nest.
func expandMacro(s, name string, fn func(args []string) (string, error)) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, name+"(")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		rest := s[i+len(name)+1:]
		args, n, err := splitArgs(rest)
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		r, err := fn(args)
		if err != nil {
			return "", err
		}
		b.WriteString(r)
		s = rest[n:]
	}
}

// splitArgs reads a parenthesised argument list whose "(" was consumed; it
// returns the arguments and the length read, closing ")" included.
func splitArgs(s string) ([]string, int, error) {
	var args []string
	depth, start := 0, 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			switch c {
			case '\\':
				i++
			case quote:
				quote = 0
			}
		case c == '\'' || c == '"' || c == '`':
			quote = c
		case c == '(':
			depth++
		case c == ')' && depth > 0:
			depth--
		case c == ')':
			args = append(args, strings.TrimSpace(s[start:i]))
			return args, i + 1, nil
		case c == ',' && depth == 0:
			args = append(args, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	return nil, 0, fmt.Errorf("unbalanced parentheses in %q", s)
}
