// Package eventrecord builds the Event broadcaster every guestbackup process
// records with: client-go's, with a spam filter that keeps a budget per
// object and reason.
package eventrecord

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
)

// NewBroadcaster returns an Event broadcaster whose spam filter counts
// Events per source, object, type and reason. client-go's default counts
// per source, object and type only: a burst of 25, then one Event every 5
// minutes, shared by every reason. Warnings that are part of a BSLS's
// normal life (a server pod starting, a password being hashed for each new
// VM) then used up the budget of the Warnings an admin audits, and a
// UserRefused was dropped without a trace. Per reason, a flapping
// condition still cannot flood the API server, and spends only its own
// budget.
func NewBroadcaster() record.EventBroadcaster {
	return record.NewBroadcaster(record.WithCorrelatorOptions(correlator(clock.RealClock{})))
}

// correlator is the correlator NewBroadcaster uses, telling time by c.
func correlator(c clock.PassiveClock) record.CorrelatorOptions {
	return record.CorrelatorOptions{SpamKeyFunc: SpamKey, Clock: c}
}

// SpamKey is the key the spam filter counts e under: client-go's (its
// source, the object it is about, its type) and its reason.
func SpamKey(e *corev1.Event) string {
	o := e.InvolvedObject
	return strings.Join([]string{
		e.Source.Component, e.Source.Host,
		o.Kind, o.Namespace, o.Name, string(o.UID), o.APIVersion,
		e.Type, e.Reason,
	}, "\x00")
}
