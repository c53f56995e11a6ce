"""An oracle object detector over the world's per-image annotations: a stand-in for a perfect VLM's grounding.

The scripted expert cannot look at pixels, so for "where in this picture is which object, and what does it
look like" it asks this detector. Given an episode image (`ImageRecord`), the detector finds the world image
it derives from by `root_url`, maps every annotated object into the episode image's own pixel frame (through
`root_box` for crops) and reports what a perfect vision model would see there: the object's box, what kind
of thing it is and its four visible attributes (colours, pattern, emblem text). It never reports entity ids,
names, editions or release dates — those are not in the pixels — and it knows nothing about tasks, so an agent
that uses it must still learn from the tools which attributes identify its target.
"""

from __future__ import annotations

import dataclasses

from ranger_jax.env import core
from ranger_jax.env.sim.world import Attributes, Box, World, box_area, box_intersection


@dataclasses.dataclass(frozen=True)
class Detection:
    """One object visible in an image.

    Attributes:
        box: pixel box [x0, y0, x1, y1] in the image's own frame, clipped to it.
        kind: what the object is ("kit", "smartphone").
        attributes: its visible colours, pattern and emblem.
        visible_fraction: share of the object's full box inside the image (1 = entirely in view).
        unhidden: share of the object not hidden behind objects in front of it (version-2 scenes; else 1).
    """

    box: Box
    kind: str
    attributes: Attributes
    visible_fraction: float
    unhidden: float = 1.0


class OracleDetector:
    """Perfect grounding of the objects in episode images, from the world's annotations.

    Args:
        world: the world the episodes run in.
        min_visible_fraction: objects with less of their box in view are not reported (too cut off to read).
        min_unhidden: objects hidden behind others beyond this are not reported (too little shows to read).
    """

    def __init__(self, world: World, *, min_visible_fraction: float = 0.25, min_unhidden: float = 0.5):
        self.world = world
        self.min_visible_fraction = min_visible_fraction
        self.min_unhidden = min_unhidden

    def detect(self, record: core.ImageRecord) -> list[Detection]:
        """The objects visible in `record`, largest first; empty for images that are not from the world."""
        root_url = record.root_url or record.url
        image = self.world.images.get(root_url) if root_url else None
        if image is None:
            return []
        frame = record.root_box if record.root_box is not None else (0.0, 0.0, float(image.width), float(image.height))
        found = []
        for obj in image.objects:
            inside = box_intersection(obj.box, frame)
            fraction = box_area(inside) / box_area(obj.box)
            if fraction < self.min_visible_fraction or obj.visible < self.min_unhidden:
                continue
            entity = self.world.entities[obj.entity_id]
            box = (inside[0] - frame[0], inside[1] - frame[1], inside[2] - frame[0], inside[3] - frame[1])
            found.append(Detection(box=box, kind=entity.noun, attributes=entity.attributes, visible_fraction=fraction,
                                   unhidden=obj.visible))
        found.sort(key=lambda d: (-box_area(d.box), d.box))
        return found
