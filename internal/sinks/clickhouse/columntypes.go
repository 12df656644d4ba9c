package clickhouse

import (
	"errors"
	"fmt"
	"strings"
)

// ColumnTypesProblem reports the columns of an existing table (columns maps
// its columns to their types, as TableReport.Columns) that cannot take what
// a writer of t inserts: the values of t's column types. clickhouse-go
// converts neither text, integers of another width or sign, floats nor
// times into one another, so such a table fails every INSERT; the error
// names each column and the statement that fixes it. It returns nil when
// every column t has in common with the table fits, or the table does not
// exist. It is for tables whose writers insert values of their spec's
// types (the exporter's metrics and inventory tables, the reconciliation's
// tables); access_logs, whose sink writes each field as the table has it,
// is checked by its own sink.
func ColumnTypesProblem(t *Table, columns map[string]string) error {
	var errs []error
	for _, c := range t.Columns {
		have, ok := columns[c.Name]
		if !ok {
			continue
		}
		want := baseType(c.Type)
		if valueKind(have) != valueKind(want) {
			errs = append(errs, fmt.Errorf("column %s of table %s has type %s, but edgepipe writes %s values into it; change it (ALTER TABLE %s MODIFY COLUMN %s %s) or drop the column",
				c.Name, t.Name, have, want, QuoteIdent(t.Name), QuoteIdent(c.Name), want))
		}
	}
	return errors.Join(errs...)
}

// baseType returns a column definition's type without what follows it at
// the top level (a codec, a default): "UInt64 CODEC(T64)" is "UInt64",
// "DateTime64(6, 'UTC')" stays whole.
func baseType(def string) string {
	depth := 0
	for i, r := range def {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ' ':
			if depth == 0 {
				return def[:i]
			}
		}
	}
	return def
}

// valueKind returns the kind of Go value a column of type typ takes from
// clickhouse-go: the type without LowCardinality and Nullable (which take
// the values of the type they wrap), text for String and FixedString, a
// time for DateTime in any precision and time zone, and the type itself
// otherwise (each integer and float type takes only its own values).
func valueKind(typ string) string {
	for {
		inner, ok := unwrap(typ, "LowCardinality")
		if !ok {
			inner, ok = unwrap(typ, "Nullable")
		}
		if !ok {
			break
		}
		typ = inner
	}
	switch {
	case typ == "String" || strings.HasPrefix(typ, "FixedString("):
		return "text"
	case typ == "DateTime" || strings.HasPrefix(typ, "DateTime(") || strings.HasPrefix(typ, "DateTime64("):
		return "time"
	}
	return typ
}

// unwrap returns the type typ wraps in wrapper(…), and whether it is one.
func unwrap(typ, wrapper string) (string, bool) {
	if !strings.HasPrefix(typ, wrapper+"(") || !strings.HasSuffix(typ, ")") {
		return typ, false
	}
	return typ[len(wrapper)+1 : len(typ)-1], true
}
