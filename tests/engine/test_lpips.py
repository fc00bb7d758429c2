"""LPIPS from the user's weights file: equal to the authors' lpips package given the same weights
(its own linear layers as shipped, AlexNet features drawn at random since torchvision's cannot be
downloaded here), one line for a file that is not LPIPS-Alex weights, and measured once per
weights file by the image pipeline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pytest_satbench.core.question import ImageRef
from pytest_satbench.datasets.demo_scenes import generate_scene
from pytest_satbench.engine.images import ImagePipeline
from pytest_satbench.engine.store import ResultStore

pytestmark = pytest.mark.slow  # importing torch and lpips: ~10 s on a busy machine

torch = pytest.importorskip("torch")
lpips_pkg = pytest.importorskip("lpips")
from test_distortion import HalfJpeg  # noqa: E402 (it needs torch: after the importorskip)

from pytest_satbench.engine.lpips import LPIPS, LpipsWeightsError  # noqa: E402  (needs torch)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    """The lpips package's LPIPS-Alex v0.1 (its shipped linear layers, seeded random AlexNet
    features) and its state dict saved as --lpips-weights takes it."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with pytest.warns(UserWarning):  # torchvision's deprecation of pretrained=False, inside lpips
        ref = lpips_pkg.LPIPS(net="alex", version="0.1", pretrained=True, pnet_rand=True, verbose=False).eval()
    path = tmp_path_factory.mktemp("lpips") / "alex_lpips.pth"
    torch.save(ref.state_dict(), path)
    return ref, path


def _ref_value(ref: object, a: np.ndarray, b: np.ndarray) -> float:
    x, y = (torch.from_numpy(np.array(i)).permute(2, 0, 1)[None].float() / 127.5 - 1 for i in (a, b))
    with torch.no_grad():
        return float(ref(x, y))  # type: ignore[operator]  # ref: the reference lpips.LPIPS, a callable


def test_lpips_equals_the_authors_package(reference: tuple[object, Path], tmp_path: Path) -> None:
    ref, path = reference
    mine = LPIPS(path)
    a, b = generate_scene(7, 1).pixels, generate_scene(7, 2).pixels
    c = np.clip(a.astype(np.int16) + 12, 0, 255).astype(np.uint8)
    for x, y in ((a, b), (a, c), (a[:100, :130], b[:100, :130])):
        got = mine(x, y)
        assert got > 0 and got == pytest.approx(_ref_value(ref, x, y), rel=1e-5, abs=1e-7)
    assert mine(a, a) == 0.0
    # the same tensors under torchvision's names (features.N.*) and only the keys it needs
    renamed = {k.split(".", 2)[2] if k.startswith("net.") else k: v for k, v in torch.load(path).items()}
    renamed = {("features." + k if k[0].isdigit() else k): v for k, v in renamed.items() if not k.startswith("lins.")}
    torch.save(renamed, tmp_path / "merged.pth")
    assert LPIPS(tmp_path / "merged.pth")(a, b) == pytest.approx(mine(a, b), rel=1e-12)


def test_a_file_that_is_not_lpips_weights_is_one_line_naming_it(reference: tuple[object, Path], tmp_path: Path) -> None:
    _, path = reference
    partial = {k: v for k, v in torch.load(path).items() if not k.startswith("lin")}
    torch.save(partial, tmp_path / "alexnet_only.pth")
    (tmp_path / "text.pth").write_text("not torch")
    for name, why in (("alexnet_only.pth", "not LPIPS-Alex weights (lin0.model.1.weight missing"),
                      ("text.pth", "not a torch state dict"), ("absent.pth", "no such file")):
        with pytest.raises(LpipsWeightsError) as exc:
            LPIPS(tmp_path / name)
        assert str(exc.value).startswith(f"--lpips-weights {tmp_path / name}: {why}") and "\n" not in str(exc.value)


def test_the_pipeline_measures_lpips_once_per_weights_file(reference: tuple[object, Path], tmp_path: Path) -> None:
    ref, path = reference
    image = tmp_path / "scene.png"
    Image.fromarray(np.concatenate([generate_scene(7, 4).pixels] * 2, axis=0)).save(image)  # 256x512
    img = ImageRef(id="s", path=str(image))
    store = ResultStore(tmp_path / "r.sqlite")
    without = ImagePipeline([HalfJpeg()], store=store)
    plain = without.get(img).result().arms["halfjpeg"].distortion
    assert plain.lpips is None and without.distortions_computed == 1
    without.close()
    store.flush()
    lp = LPIPS(path)
    first = ImagePipeline([HalfJpeg()], store=store, lpips=lp)
    arms = first.get(img).result().arms
    d = arms["halfjpeg"].distortion
    assert first.distortions_computed == 1 and d == dataclasses.replace(plain, lpips=d.lpips)
    sent = [np.asarray(Image.open(__import__("io").BytesIO(arms[k].jpeg)).convert("RGB")) for k in ("orig", "halfjpeg")]
    assert d.lpips == pytest.approx(_ref_value(ref, *sent), rel=1e-5)
    first.close()
    store.flush()
    assert store.lpips_weights_used([(arms["orig"].sha256, arms["halfjpeg"].sha256)]) == {lp.weights_sha256}
    again = ImagePipeline([HalfJpeg()], store=store, lpips=lp)
    assert again.get(img).result().arms["halfjpeg"].distortion == d and again.distortions_computed == 0
    again.close()
    store.close()
