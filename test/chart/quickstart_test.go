package chart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/local"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/internal/webhook"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// notOnTheTestBed are the README's commands the test bed cannot run, by
// their first word, and why. Every other command of the quick start runs
// verbatim; a command in neither list fails the spec, so the README cannot
// grow a step nobody ran.
var notOnTheTestBed = map[string]string{
	"docker":  "no container engine or registry: the test bed runs the binaries the image holds (go build)",
	"virtctl": "no virt-handler: the guest boots in test/kubevirt",
}

// quickStart returns the commands of the README's quick start (the first
// sh block under its heading): continued lines joined, heredocs kept with
// their command, comments and blank lines dropped.
func quickStart(readme string) []string {
	GinkgoHelper()
	_, section, ok := strings.Cut(readme, "\n## Quick start")
	Expect(ok).To(BeTrue(), "README.md has a Quick start section")
	_, block, ok := strings.Cut(section, "```sh\n")
	Expect(ok).To(BeTrue(), "the quick start has an sh block")
	block, _, ok = strings.Cut(block, "\n```")
	Expect(ok).To(BeTrue())
	var commands []string
	lines := strings.Split(block, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			line += "\n" + lines[i]
		}
		if _, rest, heredoc := strings.Cut(line, "<<'"); heredoc {
			marker, _, _ := strings.Cut(rest, "'")
			for i+1 < len(lines) {
				i++
				line += "\n" + lines[i]
				if lines[i] == marker {
					break
				}
			}
		}
		commands = append(commands, line)
	}
	return commands
}

// The README's quick start, run as written against a fresh cluster of the
// test bed: a real API server without guestbackup's CRD, cert-manager's own
// controllers, the user's real kubectl and helm. The test bed plays what a
// cluster does by itself meanwhile: it runs the controller's pod from the
// Deployment helm installed (its binary, flags, ServiceAccount and RBAC) and
// each BSLS's server pod from the Deployment the controller wrote, and marks
// them available as the deployment controller would. The webhook runs in
// this process as its ServiceAccount (the webhook binary's wiring): the test
// bed has no Service network, so the chart's webhook configuration is
// pointed at its loopback address, with a certificate for it.
var _ = Describe("The README's quick start", Ordered, func() {
	const (
		releaseNS = "guestbackup-system"
		vmNS      = "apps"
		vmName    = "web"
	)
	var (
		ctx    context.Context
		api    *testbed.APIServer
		script string
		env    []string
	)

	BeforeAll(func() {
		ctx = context.Background()
		data, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
		Expect(err).NotTo(HaveOccurred())
		commands := quickStart(string(data))
		var b strings.Builder
		b.WriteString("set -euo pipefail\n")
		for _, c := range commands {
			word := strings.Fields(c)[0]
			switch {
			case notOnTheTestBed[word] != "":
				b.WriteString(": not on the test bed, " + strconv.Quote(notOnTheTestBed[word]) + "\n")
			case word == "helm" || word == "kubectl" || strings.Contains(word, "="):
				b.WriteString("echo '+ " + strings.ReplaceAll(strings.SplitN(c, "\n", 2)[0], "'", "") + "'\n" + c + "\n")
			default:
				Fail("the quick start runs " + word + ", which this spec neither runs nor knows to skip: " + c)
			}
		}
		script = b.String()
		Expect(script).To(ContainSubstring("helm install"))
		Expect(script).To(ContainSubstring("kubectl annotate vm"))

		api = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{WithoutGuestbackupCRDs: true})
		testbed.StartCertManager(GinkgoT(), api, testbed.CertManagerOptions{})
		// The user's kubectl and helm, and nothing else of the machine's.
		dir := GinkgoT().TempDir()
		bin := filepath.Join(dir, "bin")
		Expect(os.Mkdir(bin, 0o755)).To(Succeed())
		Expect(os.Symlink(tools.Kubectl, filepath.Join(bin, "kubectl"))).To(Succeed())
		Expect(os.Symlink(tools.Helm, filepath.Join(bin, "helm"))).To(Succeed())
		env = []string{
			"PATH=" + bin + ":/usr/bin:/bin", "HOME=" + dir,
			"KUBECONFIG=" + writeKubeconfig(api),
			"HELM_CACHE_HOME=" + filepath.Join(dir, "cache"), "HELM_CONFIG_HOME=" + filepath.Join(dir, "config"), "HELM_DATA_HOME=" + filepath.Join(dir, "data"),
		}

		// The user's VM, before guestbackup is installed.
		Expect(api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vmNS}})).To(Succeed())
		Expect(api.Client.Create(ctx, &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Name: vmName, Namespace: vmNS},
			Spec:       kubevirtv1.VirtualMachineSpec{RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		})).To(Succeed())
	})

	It("reaches a Ready BSLS and an injected VM, run as written", func() {
		// What the cluster does by itself while the user types.
		const podTimeout = 5 * time.Minute
		cluster := make(chan error, 3)
		controllerBinary := testbed.Build(GinkgoT(), "./cmd/controller")
		serverBinaries := local.ServerBinaries(GinkgoT(), tools)
		go func() {
			defer GinkgoRecover()
			_, err := testbed.RunDeployment(ctx, GinkgoT(), api, types.NamespacedName{Namespace: releaseNS, Name: "guestbackup-controller"},
				testbed.PodOptions{Binaries: map[string]string{"/usr/local/bin/controller": controllerBinary}}, podTimeout)
			cluster <- err
		}()
		go func() {
			defer GinkgoRecover()
			cluster <- serveWebhook(ctx, api, releaseNS, podTimeout)
		}()
		go func() {
			defer GinkgoRecover()
			// Each BSLS's server, once the controller wrote its Deployment.
			bsls := &v1alpha1.BackupStorageLocationServer{}
			err := testbed.WaitFor(podTimeout, 200*time.Millisecond, func() (bool, error) {
				return api.Client.Get(ctx, types.NamespacedName{Namespace: "backup", Name: "main"}, bsls) == nil, nil
			})
			if err == nil {
				port, perr := testbed.FreePort()
				if perr != nil {
					cluster <- perr
					return
				}
				_, err = testbed.RunDeployment(ctx, GinkgoT(), api, types.NamespacedName{Namespace: bsls.Namespace, Name: kopiaserver.DeploymentName(bsls)},
					testbed.PodOptions{Binaries: serverBinaries, Claims: map[string]string{kopiaserver.ClaimName(bsls): GinkgoT().TempDir()},
						Ports: map[int32]int{v1alpha1.DefaultServerPort: port}}, podTimeout)
			}
			cluster <- err
		}()

		By("running the quick start's commands with bash, kubectl and helm")
		cmdCtx, cancel := context.WithTimeout(ctx, 15*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cmdCtx, "/bin/bash", "-c", script)
		cmd.Dir, cmd.Env = repoRoot, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		AddReportEntry("quick start output", out.String())
		Expect(err).NotTo(HaveOccurred(), "the quick start failed:\n%s", out.String())
		for range 3 {
			Expect(<-cluster).To(Succeed())
		}

		By("the BSLS is Ready, with its CA from cert-manager in its namespace")
		bsls := &v1alpha1.BackupStorageLocationServer{}
		Expect(api.Client.Get(ctx, types.NamespacedName{Namespace: "backup", Name: "main"}, bsls)).To(Succeed())
		Expect(bsls.Status.TLSFingerprint).NotTo(BeEmpty())
		Expect(out.String()).To(ContainSubstring("condition met"))

		By("the webhook injected the VM, and the controller made its user")
		vm := &kubevirtv1.VirtualMachine{}
		Expect(api.Client.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: vmName}, vm)).To(Succeed())
		Expect(vm.Annotations).To(HaveKey(v1alpha1.AnnotationStatus))
		Expect(vm.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("CloudInitNoCloud.UserDataSecretRef.Name", v1alpha1.CredentialSecretName(vmName))))
		Eventually(func() string {
			s := &corev1.Secret{}
			_ = api.Client.Get(ctx, types.NamespacedName{Namespace: "backup", Name: userset.SecretName("main", userset.ShardOf(vmName+"@"+vmNS))}, s)
			return string(s.Data[userset.Key])
		}).WithTimeout(time.Minute).Should(ContainSubstring(vmName + "@" + vmNS))

		By("the chart's own webhook certificate, issued in the release namespace")
		Eventually(func() error {
			return api.Client.Get(ctx, types.NamespacedName{Namespace: releaseNS, Name: "guestbackup-webhook-tls"}, &corev1.Secret{})
		}).WithTimeout(time.Minute).Should(Succeed())
	})
})

// serveWebhook plays the webhook's pod and the Service network: once helm
// created the webhook's Deployment and configuration, it serves the webhook
// in this process as the chart's ServiceAccount (cmd/webhook's wiring,
// internal/webhook), on a loopback port with a certificate for it, points the
// configuration there, and marks the Deployment available.
func serveWebhook(ctx context.Context, api *testbed.APIServer, namespace string, timeout time.Duration) error {
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
	err := testbed.WaitFor(timeout, 200*time.Millisecond, func() (bool, error) {
		return api.Client.Get(ctx, client.ObjectKey{Name: "guestbackup"}, cfg) == nil, nil
	})
	if err != nil {
		return err
	}
	certDir := GinkgoT().TempDir()
	ca, err := testbed.WriteLoopbackServingCert(certDir)
	if err != nil {
		return err
	}
	port, err := testbed.FreePort()
	if err != nil {
		return err
	}
	account := *api
	account.Config = rest.CopyConfig(api.Config)
	account.Config.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":guestbackup-webhook",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	server := ctrlwebhook.NewServer(ctrlwebhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir})
	stop, err := testbed.RunManager(&account, testbed.ManagerOptions{Logger: GinkgoLogr.WithName("webhook"), WebhookServer: server, Cache: webhook.Cache()},
		func(mgr ctrl.Manager) error { return webhook.Setup(mgr) })
	if err != nil {
		return err
	}
	DeferCleanup(stop)
	if err := testbed.WaitFor(timeout, 50*time.Millisecond, func() (bool, error) { return server.StartedChecker()(nil) == nil, nil }); err != nil {
		return err
	}
	err = testbed.WaitFor(timeout, 200*time.Millisecond, func() (bool, error) {
		if err := api.Client.Get(ctx, client.ObjectKey{Name: "guestbackup"}, cfg); err != nil {
			return false, nil
		}
		cfg.Webhooks[0].ClientConfig = admissionregistrationv1.WebhookClientConfig{
			URL: ptr.To("https://127.0.0.1:" + strconv.Itoa(port) + mutate.Path), CABundle: ca.CertPEM(),
		}
		return api.Client.Update(ctx, cfg) == nil, nil
	})
	if err != nil {
		return err
	}
	return testbed.MarkAvailable(ctx, api, types.NamespacedName{Namespace: namespace, Name: "guestbackup-webhook"}, timeout)
}

var _ = Describe("The README and docs/install.md", func() {
	It("link only to files of the user's checkout", func() {
		link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
		for _, doc := range []string{"README.md", filepath.Join("docs", "install.md")} {
			data, err := os.ReadFile(filepath.Join(repoRoot, doc))
			Expect(err).NotTo(HaveOccurred())
			for _, m := range link.FindAllStringSubmatch(string(data), -1) {
				target := m[1]
				if strings.Contains(target, "://") {
					continue
				}
				path := filepath.Join(repoRoot, filepath.Dir(doc), target)
				Expect(path).To(HavePrefix(repoRoot+string(filepath.Separator)), "%s links outside the checkout: %s", doc, target)
				_, err := os.Stat(path)
				Expect(err).NotTo(HaveOccurred(), "%s links to %s", doc, target)
			}
		}
	})
})
