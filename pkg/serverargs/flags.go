// Package serverargs is the contract between the controller and the
// guestbackup-server commands of a BSLS's server pod: one struct per
// command (Init, SyncUsers) whose fields are its flags. The controller
// writes a command line with Args; the server binds the same fields with
// AddFlags. The flag names, their defaults and the order Args writes them
// in are declared once, in each command's declare method.
//
// No field carries a secret: passwords and storage keys reach the pod in
// environment variables from Secrets, or through the API, never in a
// process's arguments, which any user of the node can read.
//
// The package imports only the standard library: both the controller and
// the server pod link it, and neither may link the other's code.
package serverargs

import (
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// The commands of guestbackup-server.
const (
	// CommandInit prepares the repository and the TLS chain (Init).
	CommandInit = "init"
	// CommandSyncUsers runs beside the Kopia server (SyncUsers).
	CommandSyncUsers = "sync-users"
)

// flags declares a command's flags on a FlagSet, remembering the order
// Args writes them in and when it writes each.
type flags struct {
	fs    *flag.FlagSet
	order []*param
}

// param is one declared flag.
type param struct {
	name string
	// always: Args writes it even at its default, so that the pod spec
	// states it (access mode, maintenance, activity cadence).
	always bool
	// with: Args writes it whenever this other field is not empty, even
	// at its default (the key of a credential Secret that Args names).
	with *string
	// expands: the kubelet is to replace $(VAR) in it with the
	// container's variable VAR ($(POD_NAMESPACE)). In every other flag a
	// $ is written $$, which the kubelet reads as one $ and expands
	// nothing: a value from a BSLS or a Velero BSL ("$(KOPIA_PASSWORD)"
	// as a bucket prefix) must never reach the server as the variable's
	// value, which would name the repository's password in its object
	// names or its DNS queries.
	expands bool
}

func (f *flags) add(name string) *param {
	p := &param{name: name}
	f.order = append(f.order, p)
	return p
}

// The declarations below set the field to its default, as the flag
// package's own do.

func (f *flags) string(p *string, name, def, usage string) *param {
	f.fs.StringVar(p, name, def, usage)
	return f.add(name)
}

func (f *flags) bool(p *bool, name string, usage string) *param {
	f.fs.BoolVar(p, name, false, usage)
	return f.add(name)
}

func (f *flags) duration(p *time.Duration, name string, def time.Duration, usage string) *param {
	f.fs.DurationVar(p, name, def, usage)
	return f.add(name)
}

func (f *flags) int64(p *int64, name string, def int64, usage string) *param {
	f.fs.Int64Var(p, name, def, usage)
	return f.add(name)
}

// pairs declares a repeated flag of <key>=<value> pairs, empty by
// default; key and value name them in its errors.
func (f *flags) pairs(p *map[string]string, name, key, value, usage string) *param {
	*p = nil
	f.fs.Var(&pairsValue{pairs: p, key: key, value: value}, name, usage)
	return f.add(name)
}

// pairsValue is a repeatable <key>=<value> flag collected into a map.
type pairsValue struct {
	pairs      *map[string]string
	key, value string
}

func (v *pairsValue) Set(s string) error {
	key, value, ok := strings.Cut(s, "=")
	if !ok || key == "" || value == "" {
		return fmt.Errorf("%q: want <%s>=<%s>", s, v.key, v.value)
	}
	if *v.pairs == nil {
		*v.pairs = map[string]string{}
	}
	(*v.pairs)[key] = value
	return nil
}

// String is the pairs by key, comma-separated (the flag package's
// default and what Args compares with it).
func (v *pairsValue) String() string { return strings.Join(v.each(), ",") }

// each is the flag's values, one per pair, by key.
func (v *pairsValue) each() []string {
	if v.pairs == nil {
		return nil // the flag package's zero value, for its -help
	}
	var out []string
	for _, key := range slices.Sorted(maps.Keys(*v.pairs)) {
		out = append(out, key+"="+(*v.pairs)[key])
	}
	return out
}

// args is command's line for v: the command, then, in declaration order,
// each flag whose value is not its default or that is always written. A
// true switch at its default false is written bare (--s3-disable-tls).
func args[T any](command string, v T, declare func(*T, *flags)) []string {
	c := v
	f := &flags{fs: flag.NewFlagSet(command, flag.ContinueOnError)}
	declare(&c, f) // records each default, setting c's fields to them
	c = v          // the flags read c's fields: now v's values
	out := []string{command}
	for _, p := range f.order {
		fl := f.fs.Lookup(p.name)
		value := fl.Value.String()
		if value == fl.DefValue && !p.always && (p.with == nil || *p.with == "") {
			continue
		}
		literal := func(s string) string {
			if p.expands {
				return s
			}
			return escapeExpansion(s)
		}
		switch v := fl.Value.(type) {
		case *pairsValue:
			for _, pair := range v.each() {
				out = append(out, "--"+p.name+"="+literal(pair))
			}
		default:
			if b, ok := v.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() && value == "true" && !p.always {
				out = append(out, "--"+p.name)
				continue
			}
			out = append(out, "--"+p.name+"="+literal(value))
		}
	}
	return out
}

// escapeExpansion writes s so that the kubelet's expansion of a
// container's arguments gives s back: it reads $$ as $, and leaves no
// $(VAR) to replace.
func escapeExpansion(s string) string {
	return strings.ReplaceAll(s, "$", "$$")
}
