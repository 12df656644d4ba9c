package accesslog

// A validating JSON scanner for the decoder's fast path: it accepts exactly
// what encoding/json's Valid accepts (FuzzValid checks it), at several times
// its speed, and splits a batch into records in the same pass. Bytes of 0x80
// and above are not checked here (the decoder checks UTF-8 on its own).

// maxNestingDepth is encoding/json's limit of nested arrays and objects.
const maxNestingDepth = 10000

// stringStop marks the bytes that end the fast loop over a string's
// content: the closing quote, a backslash, and control characters (which
// JSON forbids in strings).
var stringStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// scanString returns the index after the JSON string starting at b[i] ==
// '"', or -1 when it is not a valid string, and whether it holds escapes.
func scanString(b []byte, i int) (int, bool) {
	esc := false
	j := i + 1
	for {
		for j < len(b) && !stringStop[b[j]] {
			j++
		}
		if j >= len(b) {
			return -1, esc
		}
		switch b[j] {
		case '"':
			return j + 1, esc
		case '\\':
			esc = true
			if j+1 >= len(b) {
				return -1, esc
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+5 >= len(b) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) || !isHex(b[j+5]) {
					return -1, esc
				}
				j += 6
			default:
				return -1, esc
			}
		default: // a control character
			return -1, esc
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// scanNumber returns the index after the JSON number starting at b[i], or
// -1.
func scanNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i = scanInt(b, i); i < 0 {
		return -1
	}
	if i < len(b) && b[i] == '.' {
		if i = scanDigits(b, i+1); i < 0 {
			return -1
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		return scanDigits(b, i)
	}
	return i
}

// scanInt returns the index after a number's integer part at b[i] ("0" or
// a digit 1-9 and more digits), or -1.
func scanInt(b []byte, i int) int {
	if i < len(b) && b[i] == '0' {
		return i + 1
	}
	if i >= len(b) || b[i] < '1' || b[i] > '9' {
		return -1
	}
	return scanDigits(b, i)
}

// scanDigits returns the index after the digits at b[i] (at least one), or
// -1.
func scanDigits(b []byte, i int) int {
	if i >= len(b) || !isDigit(b[i]) {
		return -1
	}
	for i++; i < len(b) && isDigit(b[i]); i++ {
	}
	return i
}

// scanLiteral returns the index after lit at b[i], or -1.
func scanLiteral(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// scanKey checks a member key and its colon at b[i] and returns the index
// of the member's value, or -1.
func scanKey(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	e, _ := scanString(b, i)
	if e < 0 {
		return -1
	}
	e = skipSpace(b, e)
	if e >= len(b) || b[e] != ':' {
		return -1
	}
	return skipSpace(b, e+1)
}

// scanValue returns the index after the JSON value starting at b[i] (no
// space before it), validating it as encoding/json does, or -1. It keeps
// its own stack, so deep nesting costs no goroutine stack.
func scanValue(b []byte, i int) int {
	return scanValueDepth(b, i, 0)
}

// scanValueDepth is scanValue for a value already inside depth containers.
func scanValueDepth(b []byte, i, depth int) int {
	var buf [64]byte
	stack := buf[:0] // the open containers, '{' or '['
	for {
		// A value starts at b[i].
		if i >= len(b) {
			return -1
		}
		if c := b[i]; c == '{' || c == '[' {
			if depth+len(stack) >= maxNestingDepth {
				return -1
			}
			var inside bool
			if i, inside = openContainer(b, i); i < 0 {
				return -1
			}
			if inside {
				stack = append(stack, c)
				continue
			}
		} else if i = scanScalar(b, i); i < 0 {
			return -1
		}
		var more bool
		var open int
		if i, more, open = nextValue(b, i, stack); i < 0 || !more {
			return i
		}
		stack = stack[:open]
	}
}

// scanScalar returns the index after the string, number or literal at
// b[i], or -1.
func scanScalar(b []byte, i int) int {
	switch b[i] {
	case '"':
		e, _ := scanString(b, i)
		return e
	case 't':
		return scanLiteral(b, i, "true")
	case 'f':
		return scanLiteral(b, i, "false")
	case 'n':
		return scanLiteral(b, i, "null")
	}
	return scanNumber(b, i)
}

// openContainer starts the object or array at b[i]: it returns the index
// of its first value (after the key, for an object) and true, or the index
// after it and false when it is empty, or -1.
func openContainer(b []byte, i int) (int, bool) {
	end := byte('}')
	if b[i] == '[' {
		end = ']'
	}
	j := skipSpace(b, i+1)
	if j < len(b) && b[j] == end {
		return j + 1, false
	}
	if b[i] == '{' {
		j = scanKey(b, j)
	}
	return j, j >= 0
}

// nextValue continues after a value that ends at b[i] inside the open
// containers of stack: it closes the containers that end there and
// returns the index of the next value (more, with the number of containers
// still open), or the index after the outermost value (not more), or -1.
func nextValue(b []byte, i int, stack []byte) (int, bool, int) {
	open := len(stack)
	for open > 0 {
		i = skipSpace(b, i)
		if i >= len(b) {
			return -1, false, open
		}
		top := stack[open-1]
		switch {
		case b[i] == ',':
			i = skipSpace(b, i+1)
			if top == '{' {
				i = scanKey(b, i)
			}
			return i, i >= 0, open
		case top == '{' && b[i] == '}', top == '[' && b[i] == ']':
			open--
			i++
		default:
			return -1, false, open
		}
	}
	return i, false, 0
}

// validJSON reports whether b is one JSON value with only space around it,
// as encoding/json's Valid does.
func validJSON(b []byte) bool {
	i := skipSpace(b, 0)
	if i >= len(b) {
		return false
	}
	e := scanValue(b, i)
	return e >= 0 && skipSpace(b, e) == len(b)
}

// scanElements validates the array at b[i] == '[', itself inside depth
// containers, element by element, calling fn with each element, and
// returns the index after it, or -1.
func scanElements(b []byte, i, depth int, fn func(v []byte)) int {
	if depth >= maxNestingDepth {
		return -1
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1
	}
	for {
		e := scanValueDepth(b, i, depth+1)
		if e < 0 {
			return -1
		}
		fn(b[i:e])
		var more bool
		if i, more = afterValue(b, e, ']'); !more {
			return i
		}
	}
}

// scanMembers validates the object at b[i] == '{' member by member,
// calling fn with each key (without quotes; escaped tells whether it holds
// escapes) and the index of its value; fn returns the index after the
// value, or -1 for an invalid one (it validates the value itself, at depth
// 1). scanMembers returns the index after the object, or -1.
func scanMembers(b []byte, i int, fn func(key []byte, escaped bool, v int) int) int {
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return -1
		}
		ke, esc := scanString(b, i)
		if ke < 0 {
			return -1
		}
		key := b[i+1 : ke-1]
		v := scanKey(b, i)
		if v < 0 {
			return -1
		}
		e := fn(key, esc, v)
		if e < 0 {
			return -1
		}
		var more bool
		if i, more = afterValue(b, e, '}'); !more {
			return i
		}
	}
}
