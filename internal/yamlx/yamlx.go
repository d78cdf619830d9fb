// Package yamlx reads YAML files strictly and reports every problem with its file and
// line: unknown fields are errors, and types that check their own values (a limit, a
// duration) or that are checked after decoding remember the line they came from.
package yamlx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
)

// Error is a problem in a YAML file, naming the file and the line.
type Error struct {
	File string
	Line int // 0 when the problem is not at one line
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// LineError is a problem at a line, before the file is known.
type LineError struct {
	Line int
	Msg  string
}

func (e *LineError) Error() string {
	if e.Line <= 0 {
		return e.Msg
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
}

// At returns a LineError at node n.
func At(n *yaml.Node, format string, a ...any) error {
	return &LineError{Line: n.Line, Msg: fmt.Sprintf(format, a...)}
}

// AtLine returns a LineError at a line (0: not at one line).
func AtLine(line int, format string, a ...any) error {
	return &LineError{Line: line, Msg: fmt.Sprintf(format, a...)}
}

// Soft makes an error of an UnmarshalYAML method one the yaml package collects and goes
// on after: a *LineError (or several, joined) becomes a *yaml.TypeError, so that one
// decoding reports every bad value and unknown field, each at its line, rather than the
// first. Other errors are returned as they are.
func Soft(err error) error {
	if err == nil {
		return nil
	}
	var lines []string
	var walk func(error) bool
	walk = func(e error) bool {
		switch x := e.(type) {
		case *yaml.TypeError:
			lines = append(lines, x.Errors...)
		case *LineError:
			lines = append(lines, fmt.Sprintf("line %d: %s", x.Line, x.Msg))
		case interface{ Unwrap() []error }:
			for _, y := range x.Unwrap() {
				if !walk(y) {
					return false
				}
			}
		default:
			return false
		}
		return true
	}
	if !walk(err) {
		return err
	}
	return &yaml.TypeError{Errors: lines}
}

// Decode reads b into v strictly; errors name file and line.
func Decode(file string, b []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return &Error{File: file, Msg: "empty file"}
		}
		return Wrap(file, err)
	}
	return nil
}

var (
	yamlLineRe     = regexp.MustCompile(`line (\d+): (.*)`)
	unknownFieldRe = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
)

// Wrap turns an error from decoding or checking into an *Error naming file (and the line,
// where the error knows it). The yaml package's errors are reworded as this package's own
// (`unknown field "x"`, not `field x not found in type server.Config`), and when it reports
// several problems at once (unknown fields, bad types), each becomes an *Error, joined
// (errors.Join: one per line).
func Wrap(file string, err error) error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var errs []error
		for _, e := range j.Unwrap() {
			errs = append(errs, Wrap(file, e))
		}
		return errors.Join(errs...)
	}
	var le *LineError
	if errors.As(err, &le) {
		return &Error{File: file, Line: le.Line, Msg: le.Msg}
	}
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		errs := make([]error, len(te.Errors))
		for i, e := range te.Errors {
			errs[i] = wrapOne(file, e)
		}
		return errors.Join(errs...)
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return wrapOne(file, strings.TrimPrefix(msg, "unmarshal errors:\n  "))
}

// ByLine orders joined errors by their line (an *Error's; those at no line first), each
// once: a file's problems read from its top. A single error is returned as it is.
func ByLine(err error) error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return err
	}
	var flat []error
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
		} else if e != nil && !slices.ContainsFunc(flat, func(f error) bool { return f.Error() == e.Error() }) {
			flat = append(flat, e)
		}
	}
	walk(j.(error))
	line := func(e error) int {
		var fe *Error
		if errors.As(e, &fe) {
			return fe.Line
		}
		return 0
	}
	slices.SortStableFunc(flat, func(a, b error) int { return line(a) - line(b) })
	return errors.Join(flat...)
}

// wrapOne reads one of the yaml package's messages ("line 4: field x not found in type T").
func wrapOne(file, msg string) error {
	line := 0
	if m := yamlLineRe.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	if m := unknownFieldRe.FindStringSubmatch(msg); m != nil {
		msg = fmt.Sprintf("unknown field %q", m[1])
	}
	return &Error{File: file, Line: line, Msg: msg}
}

// DecodeMapping decodes a mapping node into v (a pointer to a struct without its own
// UnmarshalYAML), refusing unknown fields, and records the node's line in *line. Types
// call it from their UnmarshalYAML through a plain alias:
//
//	func (x *T) UnmarshalYAML(n *yaml.Node) error {
//		type plain T
//		return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
//	}
//
// Its errors are *yaml.TypeError (Soft): the decoding goes on, and reports every unknown
// field and bad value of the file at once.
func DecodeMapping(n *yaml.Node, v any, line *int) error {
	if n.Kind != yaml.MappingNode {
		return Soft(At(n, "want a mapping"))
	}
	*line = n.Line
	fields := fieldNames(v)
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		if !slices.Contains(fields, n.Content[i].Value) {
			errs = append(errs, At(n.Content[i], "unknown field %q", n.Content[i].Value))
		}
	}
	if err := n.Decode(v); err != nil {
		errs = append(errs, err)
	}
	return Soft(errors.Join(errs...))
}

// fieldNames lists the yaml names of the fields of the struct v points to.
func fieldNames(v any) []string {
	t := reflect.TypeOf(v).Elem()
	var out []string
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("yaml")
		if name, _, _ := strings.Cut(tag, ","); name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// Duration is a time.Duration read from "10s", "1h30m" or "2d".
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalYAML writes d as text.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// UnmarshalYAML reads a duration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return Soft(At(n, "want a duration such as 10s, 1h30m or 2d"))
	}
	v, err := ParseDuration(n.Value)
	if err != nil {
		return Soft(At(n, "bad duration %q: want a duration such as 10s, 1h30m or 2d", n.Value))
	}
	*d = Duration(v)
	return nil
}

var daysRe = regexp.MustCompile(`^(\d+)d(.*)$`)

// ParseDuration is time.ParseDuration that also reads whole days ("2d", "1d12h") and
// refuses negative durations.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	var days time.Duration
	if m := daysRe.FindStringSubmatch(s); m != nil {
		n, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil || n > 10000 {
			return 0, errors.New("bad days")
		}
		days = time.Duration(n) * 24 * time.Hour
		s = m[2]
		if s == "" {
			return days, nil
		}
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return 0, errors.New("bad duration")
	}
	return days + v, nil
}

// Limits is sluice.Limits read from its text form, with the line in its errors.
type Limits struct {
	sluice.Limits
	bad bool // the text did not parse (its error is reported): no limit to check further
}

// Bad reports whether the limit's text was given and did not parse: the decoding
// reported it, so a check of the limit's absence should not report it again.
func (l Limits) Bad() bool { return l.bad }

// UnmarshalYAML reads limits in the text form ("100/s burst=20; 4500/h").
func (l *Limits) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		l.bad = true
		return Soft(At(n, "want a limit such as '100/s burst=20'"))
	}
	v, err := sluice.Parse(n.Value)
	if err != nil {
		l.bad = true
		return Soft(At(n, "%v", err))
	}
	l.Limits = v
	return nil
}
