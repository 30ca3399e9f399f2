package testbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// What virt-api and virt-controller (v1.8.1) log, as Witnessed reads it.
const (
	// vmAdmittedMessage is what virt-api's VirtualMachine mutator logs, at
	// verbosity 4, about each VM it admits (VMsMutator.Mutate,
	// pkg/virt-api/webhooks/mutating-webhook/mutators/vm-mutator.go). On a
	// create the VM has no UID yet, so its entry's uid is empty.
	vmAdmittedMessage = "Apply defaults"
	// instanceStartedPrefix starts what virt-controller logs about each VM
	// it starts, followed by the name of the instance it created
	// (Controller.startVMI, pkg/virt-controller/watch/vm/vm.go).
	instanceStartedPrefix = "Started VM by creating the new virtual machine instance "
)

// KubeVirtLogEntry is one line of virt-api's or virt-controller's log
// (KubeVirt logs JSON, one object a line), as far as the test bed reads it.
type KubeVirtLogEntry struct {
	Level     string `json:"level"`
	Timestamp string `json:"timestamp"`
	// Pos is the source file and line that logged it.
	Pos string `json:"pos"`
	Msg string `json:"msg"`
	// Kind, Namespace, Name and UID name the object the line is about.
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

func (e KubeVirtLogEntry) String() string {
	object := e.Namespace + "/" + e.Name
	if e.Kind != "" {
		object = e.Kind + " " + object
	}
	return fmt.Sprintf("%s %s: %q (%s, %s)", e.Level, object, e.Msg, e.Pos, e.Timestamp)
}

// entries is p's log so far, the lines that are not KubeVirt's JSON left
// out (Go's own panics, client-go's klog lines).
func entries(p *Process) ([]KubeVirtLogEntry, error) {
	var out []KubeVirtLogEntry
	err := eachLine(p.LogPath, func(line []byte) error {
		var e KubeVirtLogEntry
		if json.Unmarshal(line, &e) == nil && e.Msg != "" {
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// admissions are virt-api's entries of the VMs it admitted on create, in
// order.
func admissions(log []KubeVirtLogEntry) []KubeVirtLogEntry {
	var out []KubeVirtLogEntry
	for _, e := range log {
		if e.Msg == vmAdmittedMessage && e.Kind == "VirtualMachine" && e.UID == "" {
			out = append(out, e)
		}
	}
	return out
}

// starts are virt-controller's entries of instances it created, each
// keyed by the instance's namespace/name.
func starts(log []KubeVirtLogEntry) map[string][]KubeVirtLogEntry {
	out := map[string][]KubeVirtLogEntry{}
	for _, e := range log {
		// The entry names the VM (its kind is empty: virt-controller
		// logs the VM of its informer, which carries no type).
		if name, ok := strings.CutPrefix(e.Msg, instanceStartedPrefix); ok {
			out[e.Namespace+"/"+name] = append(out[e.Namespace+"/"+name], e)
		}
	}
	return out
}

// Admission is virt-api's log entry of its admission of the creation of
// VirtualMachine namespace/name (the latest, if it was created more than
// once), and false while it has none.
func (kv *KubeVirt) Admission(namespace, name string) (KubeVirtLogEntry, bool, error) {
	log, err := entries(kv.API)
	if err != nil {
		return KubeVirtLogEntry{}, false, err
	}
	found, ok := KubeVirtLogEntry{}, false
	for _, e := range admissions(log) {
		if e.Namespace == namespace && e.Name == name {
			found, ok = e, true
		}
	}
	return found, ok, nil
}

// Start is virt-controller's log entry of its creation of
// VirtualMachineInstance namespace/name for its VM (the latest, if it made
// more than one), and false while it has none.
func (kv *KubeVirt) Start(namespace, name string) (KubeVirtLogEntry, bool, error) {
	log, err := entries(kv.Controller)
	if err != nil {
		return KubeVirtLogEntry{}, false, err
	}
	s := starts(log)[namespace+"/"+name]
	if len(s) == 0 {
		return KubeVirtLogEntry{}, false, nil
	}
	return s[len(s)-1], true, nil
}

// Witnessed checks that KubeVirt's control plane took its part in all the
// API server did since KubeVirt started, as a cluster's would:
//   - virt-api and virt-controller still run: neither exited on the way;
//   - every VirtualMachine the API server created (its audit log: any
//     client, create or server-side apply, dry runs left out) was admitted
//     by virt-api, which logs each VM its mutator defaults;
//   - every VirtualMachineInstance the API server created was created by
//     virt-controller, as its user, which logs each one it starts.
//
// A VM created twice under one name must have been admitted twice. The
// error lists everything KubeVirt missed.
func (kv *KubeVirt) Witnessed() error {
	var problems []string
	for _, p := range []*Process{kv.API, kv.Controller} {
		if exited, err := p.Exited(); exited {
			problems = append(problems, fmt.Sprintf("%s exited during the run (%v); its log ends:\n%s", p.Spec.Name, err, tail(p.LogPath, 20)))
		}
	}
	apiLog, err := entries(kv.API)
	if err != nil {
		return fmt.Errorf("virt-api's log: %w", err)
	}
	controllerLog, err := entries(kv.Controller)
	if err != nil {
		return fmt.Errorf("virt-controller's log: %w", err)
	}
	vms, err := kv.api.Created("virtualmachines")
	if err != nil {
		return err
	}
	admitted := map[string]int{}
	for _, e := range admissions(apiLog) {
		admitted[e.Namespace+"/"+e.Name]++
	}
	for _, vm := range vms {
		key := vm.Namespace + "/" + vm.Name
		if admitted[key] == 0 {
			problems = append(problems, fmt.Sprintf("VirtualMachine %s was created, but virt-api's log has no admission of it (%q)", vm, vmAdmittedMessage))
			continue
		}
		admitted[key]--
	}
	vmis, err := kv.api.Created("virtualmachineinstances")
	if err != nil {
		return err
	}
	started := starts(controllerLog)
	for _, vmi := range vmis {
		key := vmi.Namespace + "/" + vmi.Name
		switch {
		case vmi.User != kubevirtUser("kubevirt-controller"):
			problems = append(problems, fmt.Sprintf("VirtualMachineInstance %s was created by someone other than virt-controller", vmi))
		case len(started[key]) == 0:
			problems = append(problems, fmt.Sprintf("VirtualMachineInstance %s was created, but virt-controller's log has no start of it (%q)", vmi, instanceStartedPrefix+vmi.Name))
		default:
			started[key] = started[key][1:]
		}
	}
	if len(problems) > 0 {
		return errors.New("KubeVirt's control plane did not take its part in everything: " + strings.Join(problems, "; "))
	}
	return nil
}
