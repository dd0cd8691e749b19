package ratefields

// A reader of the Structured Field lists (RFC 8941) that the RateLimit and
// RateLimit-Policy fields are: items (a string or token naming a policy)
// with parameters (r=, t=, q=, w=, ...). It follows the RFC's parsing
// algorithm, and like it refuses a whole field on any syntax error. Inner
// lists are read and dropped; parameters keep their last value.

// value kinds.
const (
	kindInt = iota + 1
	kindDecimal
	kindString
	kindToken
	kindBytes
	kindBool
)

// value is a bare item: n for an integer or boolean, s for a string or
// token (or the text of a decimal or byte sequence).
type value struct {
	kind int
	n    int64
	s    string
}

type param struct {
	key string
	val value
}

// item is a list member that is an item: its bare item's text when it is a
// string or token (name), and its parameters.
type item struct {
	name   string
	params []param
}

// param returns the last value of the parameter key.
func (it *item) param(key string) (value, bool) {
	for i := len(it.params) - 1; i >= 0; i-- {
		if it.params[i].key == key {
			return it.params[i].val, true
		}
	}
	return value{}, false
}

// maxParams bounds the parameters read per item.
const maxParams = 16

// sfParser reads s from i.
type sfParser struct {
	s string
	i int
}

// parseList reads a Structured Field list of at most MaxItems members
// (inner lists count, and are dropped); ok is false on a syntax error.
func parseList(s string) (items []item, ok bool) {
	p := &sfParser{s: s}
	p.skipSP()
	members := 0
	for p.i < len(p.s) {
		members++
		if members > MaxItems {
			return nil, false
		}
		if p.peek() == '(' {
			if !p.innerList() {
				return nil, false
			}
		} else {
			it, ok := p.item()
			if !ok {
				return nil, false
			}
			items = append(items, it)
		}
		p.skipOWS()
		if p.i == len(p.s) {
			return items, true
		}
		if p.s[p.i] != ',' {
			return nil, false
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return nil, false // a trailing comma
		}
	}
	return items, true
}

func (p *sfParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// innerList reads and drops an inner list with its parameters.
func (p *sfParser) innerList() bool {
	p.i++ // (
	for {
		p.skipSP()
		if p.i >= len(p.s) {
			return false
		}
		if p.s[p.i] == ')' {
			p.i++
			_, ok := p.params()
			return ok
		}
		if _, ok := p.item(); !ok {
			return false
		}
		if c := p.peek(); c != ' ' && c != ')' {
			return false
		}
	}
}

// item reads a bare item and its parameters.
func (p *sfParser) item() (item, bool) {
	v, ok := p.bareItem()
	if !ok {
		return item{}, false
	}
	var it item
	if v.kind == kindString || v.kind == kindToken {
		it.name = v.s
	}
	it.params, ok = p.params()
	return it, ok
}

// params reads ;key[=value] parameters (a key alone is true).
func (p *sfParser) params() ([]param, bool) {
	var out []param
	for p.peek() == ';' {
		p.i++
		p.skipSP()
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		v := value{kind: kindBool, n: 1}
		if p.peek() == '=' {
			p.i++
			if v, ok = p.bareItem(); !ok {
				return nil, false
			}
		}
		if len(out) == maxParams {
			return nil, false
		}
		out = append(out, param{key, v})
	}
	return out, true
}

func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || c >= 'A' && c <= 'Z' }

// key reads a parameter's key.
func (p *sfParser) key() (string, bool) {
	start := p.i
	if c := p.peek(); !isLCAlpha(c) && c != '*' {
		return "", false
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !isLCAlpha(c) && !isDigit(c) && c != '_' && c != '-' && c != '.' && c != '*' {
			break
		}
		p.i++
	}
	return p.s[start:p.i], true
}

// bareItem reads an integer, decimal, string, token, byte sequence or
// boolean.
func (p *sfParser) bareItem() (value, bool) {
	c := p.peek()
	switch {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token(), true
	case c == ':':
		return p.bytes()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			v := value{kind: kindBool, n: int64(p.s[p.i+1] - '0')}
			p.i += 2
			return v, true
		}
	}
	return value{}, false
}

// number reads an integer (at most 15 digits) or a decimal (at most 12
// digits, a dot, 1 to 3 digits).
func (p *sfParser) number() (value, bool) {
	start := p.i
	neg := false
	if p.peek() == '-' {
		neg = true
		p.i++
	}
	digits, dot := 0, -1
	var n int64
loop:
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case isDigit(c):
			digits++
			if dot < 0 {
				n = n*10 + int64(c-'0')
			}
		case c == '.' && dot < 0:
			if digits > 12 || digits == 0 {
				return value{}, false
			}
			dot = digits
		default:
			break loop
		}
		if dot < 0 && digits > 15 || dot >= 0 && digits-dot > 3 {
			return value{}, false
		}
		p.i++
	}
	if digits == 0 || dot == digits {
		return value{}, false
	}
	if dot >= 0 {
		return value{kind: kindDecimal, s: p.s[start:p.i]}, true
	}
	if neg {
		n = -n
	}
	return value{kind: kindInt, n: n}, true
}

// str reads a quoted string with \" and \\ escapes.
func (p *sfParser) str() (value, bool) {
	p.i++ // "
	var b []byte
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '\\':
			if p.i+1 >= len(p.s) || p.s[p.i+1] != '"' && p.s[p.i+1] != '\\' {
				return value{}, false
			}
			if b == nil {
				b = append([]byte(nil), p.s[start:p.i]...)
			}
			b = append(b, p.s[p.i+1])
			p.i += 2
			continue
		case c == '"':
			s := p.s[start:p.i]
			if b != nil {
				s = string(b)
			}
			p.i++
			return value{kind: kindString, s: s}, true
		case c < 0x20 || c > 0x7e:
			return value{}, false
		}
		if b != nil {
			b = append(b, c)
		}
		p.i++
	}
	return value{}, false
}

// token reads a token (the caller checked its first byte).
func (p *sfParser) token() value {
	start := p.i
	p.i++
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !tchar(c) && c != ':' && c != '/' {
			break
		}
		p.i++
	}
	return value{kind: kindToken, s: p.s[start:p.i]}
}

// bytes reads a byte sequence, :base64:, keeping its text.
func (p *sfParser) bytes() (value, bool) {
	p.i++ // :
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == ':' {
			v := value{kind: kindBytes, s: p.s[start:p.i]}
			p.i++
			return v, true
		}
		if !isAlpha(c) && !isDigit(c) && c != '+' && c != '/' && c != '=' {
			return value{}, false
		}
		p.i++
	}
	return value{}, false
}

// tchar reports whether c may appear in an HTTP token.
func tchar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// Item is a member of a RateLimit or RateLimit-Policy list, as Items reads
// it: its name and its integer parameters.
type Item struct {
	// Name is the item's string or token ("default" for "default";q=5).
	Name string
	// Ints holds its parameters whose values are integers, by key; a
	// parameter of another type is left out.
	Ints map[string]int64
}

// Items reads the structured field list v of at most MaxItems
// members, as Parse does, and returns its items whole (inner lists are
// dropped); ok is false on a syntax error. It is for checks that want
// every item, such as a test's assertions on a response sluice wrote.
func Items(v string) (items []Item, ok bool) {
	if len(v) > MaxFieldLen {
		return nil, false
	}
	list, ok := parseList(v)
	if !ok {
		return nil, false
	}
	for _, it := range list {
		out := Item{Name: it.name, Ints: map[string]int64{}}
		for _, p := range it.params {
			if p.val.kind == kindInt {
				out.Ints[p.key] = p.val.n
			} else {
				delete(out.Ints, p.key)
			}
		}
		items = append(items, out)
	}
	return items, true
}
