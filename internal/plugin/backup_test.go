package plugin

import "testing"

func TestVMName(t *testing.T) {
	for arg, want := range map[string]string{
		"web":                            "web",
		"vm/web":                         "web",
		"VirtualMachine/web":             "web",
		"virtualmachines/web":            "web",
		"virtualmachine.kubevirt.io/web": "web",
		"pod/web":                        "",
		"vm/":                            "",
		"vm/team-a/web":                  "",
	} {
		got, err := vmName(arg)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("vmName(%q) = %q, %v; want %q", arg, got, err, want)
		}
	}
}
