package testbed

import "strings"

// expand replaces $(VAR) in s with vars' VAR, by the kubelet's rules for a
// container's command, arguments and variables: $$ is one $, and nothing
// of what follows it is expanded; $(VAR) of a variable vars does not hold
// stays as it is, as does a $( that no ) closes and a $ before anything
// else.
func expand(s string, vars map[string]string) string {
	var out strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 || i == len(s)-1 {
			out.WriteString(s)
			return out.String()
		}
		out.WriteString(s[:i])
		rest := s[i+1:]
		switch rest[0] {
		case '$':
			out.WriteByte('$')
			s = rest[1:]
		case '(':
			end := strings.IndexByte(rest, ')')
			if end < 0 {
				out.WriteString("$(")
				s = rest[1:]
				continue
			}
			name := rest[1:end]
			if v, ok := vars[name]; ok {
				out.WriteString(v)
			} else {
				out.WriteString("$(" + name + ")")
			}
			s = rest[end+1:]
		default:
			out.WriteString("$" + rest[:1])
			s = rest[1:]
		}
	}
}
