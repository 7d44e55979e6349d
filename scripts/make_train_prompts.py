"""Write src/specledger/data/train_prompts.jsonl: prompts across the six task kinds for self-distilling a draft head.

The target model answers these prompts and the head learns from its features, so the prompts only need to be
varied, natural requests; no references. Deterministic (seeded); no overlap with the built-in workload.

    python scripts/make_train_prompts.py            # writes the file, prints counts per kind
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "specledger" / "data" / "train_prompts.jsonl"
rng = random.Random(20250101)


def pick(items, k):
    return rng.sample(items, min(k, len(items)))


# --- multi-turn conversation style requests (MT-Bench categories) ---------------------------------------

STORY_SUBJECTS = [
    "a lighthouse keeper who finds a message in a bottle",
    "the first warm day of spring in a big city",
    "a robot that is learning to bake bread",
    "an old bicycle that has had many owners",
    "a rainy Sunday afternoon at home",
    "a lost cat trying to find its way home",
    "a child's first trip to the sea",
    "a friendship between a fox and a crow",
    "moving to a new country and learning the language",
    "a night train crossing the mountains",
    "a grandmother's handwritten recipe book",
    "a power cut in a busy apartment building",
    "a football team that has not won a match all season",
    "a library after closing time",
    "a village festival at the end of the harvest",
    "a beekeeper and her hives",
    "the last day before the summer holidays",
    "a street musician who plays every morning at the same corner",
    "a snowstorm that closes every road into a small town",
    "an astronaut looking at the Earth from the space station",
]
STORY_FORMS = [
    "Write a short poem about {s}.",
    "Write a short story of about 150 words about {s}.",
    "Write a four-line rhyming poem about {s}.",
    "Write a diary entry from the point of view of {s}.",
    "Write the opening paragraph of a children's book about {s}.",
    "Write a haiku about {s}, then explain the image you chose.",
]
PRACTICAL_WRITING = [
    "Write a polite email to my landlord asking him to fix a leaking kitchen tap this week.",
    "Write a short thank-you note to a colleague who covered my shifts while I was ill.",
    "Write a product description for a reusable water bottle that keeps drinks cold for 24 hours.",
    "Draft a short announcement for a neighbourhood clean-up day on Saturday morning.",
    "Write a cover letter opening paragraph for a junior graphic designer position.",
    "Write a friendly reminder to my book club that we meet on Thursday at seven.",
    "Write a short speech to welcome new students on their first day at university.",
    "Write an out-of-office reply for someone who is on holiday until Monday.",
    "Write a short review of a small Italian restaurant that has great pasta but slow service.",
    "Write a message apologising to a customer whose order arrived two days late.",
    "Write a short blog post introduction about learning to cook at the age of forty.",
    "Write a short invitation to a surprise birthday party for my brother.",
    "Write three slogans for a bicycle repair shop.",
    "Write a short job advert for a part-time barista at a busy café.",
    "Write a LinkedIn post announcing that I have finished a data analysis course.",
    "Rewrite this sentence to sound more professional: 'hey, can u send me the report asap?'",
    "Write a short toast for my parents' thirtieth wedding anniversary.",
    "Write a short letter to a local council asking for more bicycle parking near the station.",
]
ROLEPLAY = [
    "Pretend you are a pirate captain explaining to your new crew why they must keep the ship clean.",
    "You are a friendly librarian. A teenager asks you to recommend three books for someone who dislikes reading. What do you say?",
    "Act as a personal trainer and give me a ten-minute morning workout I can do without equipment.",
    "Pretend you are a medieval knight who has just seen a smartphone for the first time. Describe it.",
    "You are a chef on a cooking show. Explain to the audience how to make a simple omelette.",
    "Act as a travel agent and suggest a three-day trip to Lisbon for a couple who love food and history.",
    "Pretend you are a detective questioning a witness about a missing painting. Write the first few questions you would ask.",
    "You are a museum guide standing in front of a dinosaur skeleton. Tell a group of children about it.",
    "Act as a job interviewer and ask me three questions for a customer service role.",
    "Pretend you are a weather forecaster presenting a stormy forecast for the weekend.",
    "You are a shopkeeper in a small bakery. A customer asks which bread is best for sandwiches. Answer them.",
    "Act as a calm flight attendant explaining to passengers that the plane will be delayed by one hour.",
    "Pretend you are Sherlock Holmes describing what you can tell about a stranger from their shoes.",
    "You are a gardening expert on a radio phone-in. A caller says her tomato leaves are turning yellow. What do you tell her?",
    "Act as a kind teacher helping a nervous student prepare for their first class presentation.",
    "Pretend you are a tour guide on a boat in Amsterdam. Describe what the passengers can see along the canal.",
]
NAMES = ["Alice", "Bruno", "Chen", "Dana", "Emil", "Farah", "Gabe", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Mateo", "Nora", "Oskar", "Priya"]
RELATIONS = [("older", "youngest"), ("taller", "shortest"), ("faster", "slowest"), ("heavier", "lightest")]


def reasoning_prompts() -> list[str]:
    out = []
    for _ in range(10):
        a, b, c = pick(NAMES, 3)
        more, least = rng.choice(RELATIONS)
        out.append(f"{a} is {more} than {b}, and {c} is {more} than {a}. Who is the {least}? Explain your reasoning.")
    out += [
        "All roses are flowers, and some flowers fade quickly. Can we conclude that some roses fade quickly? Explain.",
        "If it takes five machines five minutes to make five parts, how long would it take 100 machines to make 100 parts?",
        "A farmer has chickens and cows. Together they have 20 heads and 56 legs. How many of each animal are there?",
        "I have two coins that add up to 30 cents, and one of them is not a nickel. What are the two coins?",
        "A clock shows 3:15. What is the angle between the hour hand and the minute hand?",
        "Which is heavier, a kilogram of feathers or a kilogram of iron? Explain why people often get this wrong.",
        "If yesterday was Friday, what day will it be the day after tomorrow?",
        "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much does the ball cost?",
    ]
    return out


CODING_TASKS = [
    "reverses a string without using slicing",
    "checks whether a word is a palindrome",
    "returns the largest number in a list without using max()",
    "counts how many vowels are in a sentence",
    "removes duplicates from a list while keeping the original order",
    "converts a temperature from Celsius to Fahrenheit",
    "returns the n-th Fibonacci number",
    "checks whether a number is prime",
    "merges two sorted lists into one sorted list",
    "counts how often each word appears in a text",
    "returns the second smallest number in a list",
    "flattens a list of lists into a single list",
    "checks whether two strings are anagrams of each other",
    "computes the factorial of a number using recursion",
    "finds the longest word in a sentence",
    "rounds a price to the nearest five cents",
    "capitalises the first letter of every word in a sentence",
    "returns the sum of the digits of an integer",
]
CODING_FORMS = [
    "Write a Python function that {t}.",
    "Write a JavaScript function that {t}, and show one example call.",
    "Can you write a short Python function that {t}? Please add a docstring.",
]
CODING_EXTRA = [
    "Explain the difference between a list and a tuple in Python.",
    "What does the SQL keyword JOIN do? Give a small example with two tables.",
    "Explain what a race condition is, with a simple example.",
    "What is the difference between git merge and git rebase?",
    "Explain what Big O notation means using a simple example.",
    "Why should passwords be hashed instead of stored as plain text?",
    "Write a SQL query that finds the five customers who spent the most money.",
    "Explain what a REST API is to someone who has never programmed.",
]

EXTRACT_PEOPLE = ["Sofia Marin", "James Okafor", "Yuki Tanaka", "Peter Lindqvist", "Amara Diallo", "Lucas Ferreira", "Mei Lin", "Tomasz Nowak"]
EXTRACT_ORGS = ["Bluepeak Foods", "Orion Cycles", "Harbor Analytics", "Greenleaf Pharmacy", "Quartz Media", "Redstone Builders", "Silverline Travel", "Maple Software"]
EXTRACT_CITIES = ["Porto", "Nairobi", "Osaka", "Gothenburg", "Dakar", "Curitiba", "Chengdu", "Krakow"]


def extraction_prompts() -> list[str]:
    out = []
    forms = [
        'Extract the person, the organisation and the city from this sentence: "{s}"',
        'List every name, place and date mentioned in this text: "{s}"',
        'From the following sentence, give me the job title and the start year as JSON: "{s}"',
    ]
    for i in range(14):
        person, org, city = rng.choice(EXTRACT_PEOPLE), rng.choice(EXTRACT_ORGS), rng.choice(EXTRACT_CITIES)
        year = rng.randint(2005, 2024)
        role = rng.choice(["chief executive", "head of marketing", "lead engineer", "finance director", "store manager"])
        sentence = f"{person} joined {org} in {city} as {role} in {year}."
        out.append(forms[i % len(forms)].format(s=sentence))
    out += [
        'Extract all the prices from this receipt text: "2 coffees 6.40, 1 croissant 2.10, 1 orange juice 3.50, total 12.00"',
        'Pull out the dates and the event names from this text: "The spring fair runs on 12 April, the book sale on 3 May and the open day on 21 June."',
        'Find the email addresses in this text: "Contact sales at sales@example.com or support at help@example.org for questions."',
        'From this review, extract the product, the rating and the main complaint: "The Vento fan is quiet and cheap, four stars, but the remote stopped working after a week."',
    ]
    return out


STEM_TOPICS = [
    "photosynthesis", "how vaccines train the immune system", "why the Moon has phases", "how a rainbow forms",
    "what DNA is", "how an electric motor works", "why ice floats on water", "what a black hole is",
    "how batteries store energy", "the water cycle", "how GPS works out your position", "what inflation means in economics",
    "why we have seasons", "how a refrigerator keeps food cold", "what an atom is made of", "how the heart pumps blood",
    "what machine learning is", "why the sea is salty", "how earthquakes happen", "what gravity is",
    "how plants know which way is up", "why metals conduct electricity", "what a prime number is", "how sound travels",
]
STEM_FORMS = [
    "Explain {t} in simple terms.",
    "Can you explain {t} to a ten-year-old?",
    "Give me a short, clear explanation of {t}, with one everyday example.",
]
HUMANITIES_TOPICS = [
    "the causes of the French Revolution", "why the printing press was important", "the main ideas of Stoicism",
    "what the Silk Road was", "the difference between a democracy and a republic", "why the Roman Empire declined",
    "what the Industrial Revolution changed in everyday life", "the meaning of the word 'utopia'",
    "what impressionism is in painting", "the role of the Nile in ancient Egypt", "what the Magna Carta was",
    "why people started living in cities", "the main themes of George Orwell's novel 1984",
    "how the Olympic Games began", "what the Cold War was", "the history of the bicycle",
]
HUMANITIES_FORMS = [
    "Explain {t} in a short paragraph.",
    "What should a beginner know about {t}?",
    "Write three key points about {t} for a school presentation.",
]


def multi_turn_prompts() -> list[str]:
    out = []
    for subject in STORY_SUBJECTS:
        out += [f.format(s=subject) for f in pick(STORY_FORMS, 2)]
    out += PRACTICAL_WRITING + ROLEPLAY + reasoning_prompts()
    for task in CODING_TASKS:
        out.append(rng.choice(CODING_FORMS).format(t=task))
    out += CODING_EXTRA + extraction_prompts()
    for topic in STEM_TOPICS:
        out.append(rng.choice(STEM_FORMS).format(t=topic))
    for topic in HUMANITIES_TOPICS:
        out.append(rng.choice(HUMANITIES_FORMS).format(t=topic))
    return out


# --- translation ------------------------------------------------------------------------------------------

ENGLISH_SENTENCES = [
    "The meeting has been moved to Thursday afternoon.",
    "Could you recommend a good restaurant near the hotel?",
    "I forgot my umbrella at the office yesterday.",
    "The children are playing football in the park.",
    "We need to buy milk, eggs and bread for breakfast.",
    "How long does it take to walk to the museum?",
    "My brother is studying medicine in another city.",
    "The train was late because of the snow.",
    "Please close the window, it is getting cold.",
    "She has been learning the piano for three years.",
    "The shop opens at nine and closes at six.",
    "I would like to book a table for four people.",
    "Our neighbours are painting their house blue.",
    "Is there a pharmacy open on Sunday?",
    "The concert was cancelled because the singer was ill.",
    "He reads the newspaper every morning with his coffee.",
    "We are planning a trip to the mountains in August.",
    "Can I pay by card, or only in cash?",
    "The library has a new section for children's books.",
    "It rained all week, but the weekend was sunny.",
    "My phone battery is almost empty.",
    "The doctor told me to drink more water.",
    "They moved to a bigger apartment last spring.",
    "Turn left at the bakery and the station is on your right.",
    "I am sorry, I do not understand the question.",
    "The garden looks beautiful in the early morning light.",
    "Do you know where I can buy a bus ticket?",
    "The price of vegetables has gone up this year.",
    "We watched an old film and ate popcorn.",
    "Tomorrow I have to get up very early for work.",
    "This soup needs a little more salt.",
    "The hotel room has a small balcony with a view of the sea.",
    "Remember to water the plants while I am away.",
    "The new bridge will open next month.",
    "My grandfather grew up on a farm near the river.",
    "Excuse me, is this seat free?",
]
FOREIGN_SENTENCES = [
    ("French", "Nous avons visité le marché ce matin et acheté des fraises."),
    ("French", "Il fait trop chaud pour travailler dans le jardin aujourd'hui."),
    ("French", "Mon frère cherche un nouvel emploi depuis deux mois."),
    ("French", "Pouvez-vous parler un peu plus lentement, s'il vous plaît ?"),
    ("Spanish", "El autobús sale cada veinte minutos desde la plaza."),
    ("Spanish", "Mañana vamos a cenar en casa de mis abuelos."),
    ("Spanish", "No encuentro mis llaves, ¿las has visto?"),
    ("Spanish", "La película fue más larga de lo que esperaba."),
    ("German", "Ich trinke morgens meistens einen Tee mit Honig."),
    ("German", "Die Kinder haben im Schnee einen großen Schneemann gebaut."),
    ("German", "Kannst du mir bitte helfen, den Tisch zu tragen?"),
    ("German", "Das Restaurant an der Ecke ist am Montag geschlossen."),
    ("Italian", "Abbiamo camminato lungo la spiaggia fino al tramonto."),
    ("Italian", "Questo treno va direttamente a Milano?"),
    ("Portuguese", "Eu gosto de ler livros antes de dormir."),
    ("Portuguese", "A loja fica ao lado da farmácia."),
]
TARGETS = ["French", "Spanish", "German", "Italian", "Portuguese"]
TRANSLATE_FORMS = [
    "Translate into {dst}: {text}",
    "How would you say this in {dst}? \"{text}\"",
    "Please translate the following sentence from {src} to {dst}.\n\n{text}",
    "Translate this {src} sentence into {dst} and keep the tone informal: {text}",
]


def translation_prompts() -> list[str]:
    out = []
    for sentence in ENGLISH_SENTENCES:
        for dst in pick(TARGETS, 2):
            out.append(rng.choice(TRANSLATE_FORMS).format(src="English", dst=dst, text=sentence))
    for src, sentence in FOREIGN_SENTENCES:
        out.append(rng.choice(TRANSLATE_FORMS).format(src=src, dst="English", text=sentence))
        out.append(f"What does this {src} sentence mean in English? {sentence}")
    return out


# --- summarization ----------------------------------------------------------------------------------------

PASSAGES = [
    "A small bakery in the town of Ashby has started giving its unsold bread to a local food bank every "
    "evening. The owner said she used to throw away up to thirty loaves a day, which felt wrong when some "
    "families in the town struggle to afford food. Volunteers collect the bread at closing time and hand it "
    "out the next morning. Two other shops on the same street have since joined the scheme, donating fruit "
    "and vegetables that are slightly past their best.",
    "Engineers have finished testing a new kind of road surface that absorbs rainwater instead of letting it "
    "run off into drains. The surface is made of a porous material that lets water soak into a layer of "
    "gravel underneath, where it drains slowly into the ground. In a one-year trial on a car park, the "
    "surface stayed dry during heavy storms and showed no cracks after winter frost. The city plans to use it "
    "on several quiet residential streets that often flood.",
    "The annual kite festival on Brennan Beach attracted more than fifteen thousand visitors this weekend. "
    "Kite makers from twelve countries flew giant kites shaped like whales, dragons and octopuses, some more "
    "than twenty metres long. Strong winds on Saturday forced organisers to pause the show for two hours, but "
    "Sunday's calm, sunny weather made up for it. Local hotels reported that almost every room in town was "
    "booked, and the festival will return next year with a new night-time show using kites with lights.",
    "A secondary school has replaced its end-of-year exams in two subjects with projects that students work "
    "on for a whole term. In science, pupils design and run their own experiments; in history, they research "
    "the story of a building in their neighbourhood. Teachers say students are more engaged and learn to "
    "plan their time, although marking the projects takes longer than marking exams. Parents were divided: "
    "some welcomed the change, while others worried it would leave their children less prepared for exams later.",
    "A family of beavers has returned to the river Wend for the first time in more than three hundred years. "
    "Wildlife officers spotted gnawed trees and a small dam last autumn and later filmed the animals at night. "
    "Beavers build dams that slow down rivers and create ponds, which can help other wildlife and reduce "
    "flooding downstream. Some farmers are worried that the ponds could flood their fields, and the officers "
    "have promised to monitor the dams and move them if they cause problems.",
    "A software company has announced that its staff will work four days a week for the same pay, after a "
    "six-month trial. During the trial, the company measured how many customer problems were solved and how "
    "quickly new features were delivered, and found that both stayed about the same. Staff said they felt less "
    "stressed and took fewer sick days. The company admitted that some teams had to cut back on meetings to "
    "make the shorter week work, and said it will review the scheme every year.",
    "The city of Marlow has opened its first public swimming pool heated entirely by waste heat from a nearby "
    "data centre. Servers in data centres produce a lot of heat, which is usually released into the air. "
    "Here, the warm water from the cooling system is piped under the street to the pool. The city says this "
    "will save most of the pool's heating bill and cut its carbon emissions. The pool is open every day, and "
    "swimming lessons for children are free during the first summer.",
    "An amateur astronomer in a small village has discovered a new comet using a telescope in her back "
    "garden. She noticed a faint, fuzzy object that moved slightly between photographs taken an hour apart "
    "and reported it to an international observatory, which confirmed the find two days later. The comet "
    "will be named after her. Experts say it is unlikely to become bright enough to see without a telescope, "
    "but it will be visible through binoculars for a few weeks in the spring.",
    "A supermarket chain is testing shelves with electronic price labels that can be changed from a central "
    "computer. The company says the labels save staff many hours of replacing paper tags and reduce mistakes "
    "at the checkout. Consumer groups have raised concerns that prices could be changed many times a day, "
    "for example raising them at busy times. The supermarket has promised that prices will change no more "
    "than once a day and that any change will be shown clearly.",
    "Volunteers have planted more than five thousand trees along an old railway line that closed forty years "
    "ago. The line is being turned into a path for walkers and cyclists that will link three villages. The "
    "trees include oak, cherry and hazel, chosen because they support insects and birds. The project was paid "
    "for by local businesses and a national grant, and the first six kilometres of the path will open in the summer.",
    "Doctors at a regional hospital have started prescribing gardening to some patients who feel lonely or "
    "anxious. Patients spend two mornings a week at a community garden, where they grow vegetables with a "
    "small group and a trained gardener. After three months, most participants said they felt calmer and had "
    "made new friends. The hospital says the programme costs less than many other treatments and hopes to "
    "offer it at two more gardens next year.",
    "A museum has returned a carved wooden mask to the community in the country where it was made, more than "
    "a century after it was taken by a collector. The mask had been on display in the museum's main hall for "
    "decades. Leaders of the community travelled to the museum for a ceremony and said the mask would be "
    "kept in a cultural centre where young people can learn about its history. The museum said it is "
    "reviewing other objects in its collection with similar stories.",
]
SUMMARY_FORMS = [
    "Summarize this article in one sentence:\n\n{p}",
    "Give me three bullet points that sum up the following text.\n\n{p}",
    "Write a short headline and a one-sentence summary for this news story.\n\n{p}",
    "Explain the main point of this passage to a child in two simple sentences.\n\n{p}",
    "Summarize the text below in about thirty words.\n\n{p}",
    "What are the key facts in this report? Keep your answer short.\n\n{p}",
]


def summarization_prompts() -> list[str]:
    return [form.format(p=p) for p in PASSAGES for form in pick(SUMMARY_FORMS, 5)]


# --- question answering -----------------------------------------------------------------------------------

QUESTIONS = [
    "What is the longest river in Africa?", "Who painted the Mona Lisa?", "What is the boiling point of water at sea level in Celsius?",
    "Which country has the largest population in South America?", "What gas do plants absorb from the air?",
    "Who was the first person to walk on the Moon?", "What is the hardest natural substance?",
    "How many bones are there in the adult human body?", "What is the capital of Canada?",
    "Which element has the chemical symbol O?", "Who developed the theory of relativity?",
    "What is the smallest prime number?", "In which country are the pyramids of Giza?",
    "What language is mainly spoken in Brazil?", "What is the tallest mountain in the world?",
    "How many days are there in a leap year?", "Who wrote the novel Pride and Prejudice?",
    "What is the freezing point of water in Fahrenheit?", "Which planet is closest to the Sun?",
    "What is the main ingredient of guacamole?", "What instrument has 88 keys?",
    "Which organ in the human body produces insulin?", "What is the currency of Japan?",
    "Who composed the Fifth Symphony that begins with four famous notes?", "How many sides does a hexagon have?",
    "What is the largest desert in the world?", "Which animal is known as the king of the jungle?",
    "In which city is the Eiffel Tower?", "What is the square root of 144?",
    "Who discovered penicillin?", "What is the capital of Kenya?", "How many players are on a football team on the pitch?",
    "Which metal is liquid at room temperature?", "What is the largest mammal on Earth?",
    "Which continent is Egypt in?", "What do bees make?", "How many minutes are there in a day?",
    "What is the name of the galaxy we live in?", "Which country gave the Statue of Liberty to the United States?",
    "What is the capital of Spain?", "Who invented the telephone?", "What is the chemical formula for water?",
    "What is the largest country in the world by area?", "Which ocean lies between Africa and Australia?",
    "What is the name of the process by which water turns into vapour?", "How many strings does a standard guitar have?",
    "Who was the first woman to win a Nobel Prize?", "Which bird is a symbol of peace?",
    "What is the capital of Egypt?", "What is the speed of light, roughly, in kilometres per second?",
    "Which vitamin does the body make when skin is exposed to sunlight?", "What is the official language of Argentina?",
    "What is the longest bone in the human body?", "Which planet has the most famous rings?",
    "How many hours are there in a week?", "Who wrote The Odyssey?", "What is the capital of South Korea?",
    "What is a baby kangaroo called?", "Which sea is the saltiest large body of water on Earth?",
    "What is the most spoken language in the world by number of native speakers?", "Which country is home to the city of Marrakesh?",
    "What colour do you get by mixing blue and yellow?", "What is the capital of Norway?",
    "In which year did the Berlin Wall fall?", "Who is the author of the Harry Potter books?",
    "What part of a plant carries out most photosynthesis?", "What unit is used to measure electrical resistance?",
    "Which country invented paper?", "What is the capital of Portugal?", "How many centimetres are in a metre?",
    "Which famous scientist proposed the laws of motion?", "What is the largest island in the world?",
    "What is the national animal of Australia often said to be?", "Which river flows through London?",
    "What do you call a word that means the opposite of another word?", "How many legs does a spider have?",
    "What is the capital of Turkey?", "Who painted The Starry Night?", "Which planet is the largest in our solar system?",
]
QA_FORMS = ["{q}", "Quick question: {q}", "{q} Please answer briefly.", "Can you tell me: {q}"]


def qa_prompts() -> list[str]:
    return [rng.choice(QA_FORMS).format(q=q) for q in QUESTIONS]


# --- math word problems -----------------------------------------------------------------------------------


PEOPLE = ["Sam", "Lucy", "Omar", "Ines", "Raj", "Greta", "Leo", "Mira", "Tariq", "Julia"]
PACKS = [("apples", "bag"), ("pencils", "box"), ("stickers", "sheet"), ("eggs", "carton"), ("cookies", "tin")]


def math_problem(i: int) -> str:
    n, r = rng.choice(PEOPLE), rng.randint
    which = i % 14
    if which == 0:
        return f"{n} has {r(20, 60)} marbles, gives {r(3, 15)} to a friend and then buys {r(2, 20)} more. How many marbles does {n} have now?"
    if which == 1:
        thing, pack = rng.choice(PACKS)
        plural = pack + ("es" if pack.endswith("x") else "s")
        return f"There are {r(6, 24)} {thing} in a {pack}. {n} buys {r(3, 9)} {plural}. How many {thing} does {n} have in total?"
    if which == 2:
        return f"A shirt costs ${rng.choice([20, 25, 30, 40, 50, 60, 80])}. It is on sale for {rng.choice([10, 20, 25, 50])}% off. What is the sale price?"
    if which == 3:
        return (f"A car uses {rng.choice([5, 6, 7, 8])} litres of fuel every 100 kilometres. "
                f"How many litres does it need for a trip of {rng.choice([250, 300, 450, 600, 800])} kilometres?")
    if which == 4:
        return (f"{n} reads {rng.choice([12, 15, 20, 25])} pages a day. The book has {rng.choice([180, 240, 300, 360])} pages. "
                "How many days will it take to finish the book?")
    if which == 5:
        return f"A garden is {r(6, 30)} metres long and {r(4, 20)} metres wide. How much fencing is needed to go all the way around it?"
    if which == 6:
        return (f"{n} earns ${rng.choice([12, 15, 18, 20, 22])} per hour and works {rng.choice([10, 20, 25, 30])} hours a week. "
                f"How much does {n} earn in {r(2, 6)} weeks?")
    if which == 7:
        return (f"A school orders {rng.choice([12, 15, 18, 20])} boxes of crayons with {rng.choice([8, 10, 12, 24])} crayons in each box. "
                f"The crayons are shared equally among {rng.choice([2, 3, 4, 6])} classes. How many crayons does each class get?")
    if which == 8:
        return (f"A recipe needs {rng.choice([150, 200, 250, 300])} grams of flour for {rng.choice([6, 8, 10])} pancakes. "
                f"How much flour is needed for {rng.choice([12, 20, 24, 30])} pancakes?")
    if which == 9:
        return (f"A cyclist rides at {rng.choice([15, 18, 20, 24])} kilometres per hour for {rng.choice([2, 3])} hours and then at "
                f"{rng.choice([10, 12, 14])} kilometres per hour for {rng.choice(['one more hour', 'two more hours'])}. How far does she ride in total?")
    if which == 10:
        a = rng.choice([20, 40, 50, 80])
        return f"The price of a concert ticket rose from ${a} to ${a + a * rng.choice([1, 2, 3]) // 4}. By what percentage did the price increase?"
    if which == 11:
        return (f"{n} is {r(6, 12)} years old, and {n}'s father is {rng.choice([3, 4])} times as old. "
                f"How old will the father be in {r(2, 10)} years?")
    if which == 12:
        t = rng.choice([20, 24, 30, 40])
        return f"In a box of {t} balls, {t // 4} are red, {t // 4 + r(1, 3)} are blue and the rest are green. What fraction of the balls are green?"
    fill = rng.choice(["half", "one quarter", "three quarters", "one third"])
    return f"A tank holds {rng.choice([120, 200, 240, 360])} litres of water and is {fill} full. How many more litres are needed to fill it?"


def math_prompts() -> list[str]:
    suffixes = ["", " Show your working.", " Explain each step.", " Think step by step."]
    return [math_problem(i) + rng.choice(suffixes) for i in range(84)]


# --- retrieval-augmented questions ------------------------------------------------------------------------

TOWN_NAMES = ["Brackwater", "Elmstead", "Fennick", "Goldmoor", "Hollin", "Kestow", "Larchmont", "Norwell", "Oakridge", "Pellham", "Quarry Bay", "Ravensby"]
RIVERS = ["Ister", "Calder", "Marrow", "Fenn", "Aske", "Wyre"]
INDUSTRIES = ["wool", "pottery", "paper", "shipbuilding", "glass", "cheese"]
COMPANIES = ["Lumen Grid", "Tessera Foods", "Northgate Robotics", "Bramble Books", "Cobalt Marine", "Aster Health", "Fieldstone Tools", "Nimbus Air"]
PRODUCTS = ["solar lamps", "frozen pastries", "warehouse robots", "children's books", "boat engines", "blood pressure monitors", "garden tools", "weather balloons"]
FOUNDERS = ["Ruth Adeyemi", "Karl Jensen", "Ana Silva", "Daniel Moreau", "Hiro Sato", "Elena Petrova", "Samir Khan", "Grace Ng"]
HQ = ["Leeds", "Bergen", "Bilbao", "Ghent", "Tampere", "Aarhus", "Cork", "Lille"]
ARTISTS = ["Marta Kowal", "Ibrahim Sesay", "Clara Vidal", "Niels Holm", "Rosa Albescu", "Tomas Reyes", "Ingrid Falk", "Yusuf Demir", "Lotte Brandt"]
CRAFTS = [("cellist", "recordings of Bach's cello suites"), ("photographer", "black-and-white portraits of fishermen"),
          ("sculptor", "large bronze birds in public parks"), ("novelist", "a trilogy set in a coastal village"),
          ("architect", "a library built almost entirely from wood"), ("poet", "short poems about city life")]
BIRTH_CITIES = ["Tallinn", "Seville", "Bruges", "Lodz", "Accra", "Valparaiso", "Turku", "Izmir", "Cluj"]


def rag_prompts() -> list[str]:
    forms = [
        "Read the passages and answer the question.\n\n{p}\n\nQuestion: {q}",
        "Answer the question using only the information in these passages.\n\n{p}\n\nQuestion: {q}",
        "{p}\n\nBased on the passages above, {q_lower}",
    ]
    out = []

    def render(facts: list[str], question: str) -> str:
        rng.shuffle(facts)
        passages = "\n\n".join(f"Passage {i}: {f}" for i, f in enumerate(facts, start=1))
        form = rng.choice(forms)
        return form.format(p=passages, q=question, q_lower=question[0].lower() + question[1:])

    for i in range(30):
        town, river, industry = TOWN_NAMES[i % len(TOWN_NAMES)], rng.choice(RIVERS), rng.choice(INDUSTRIES)
        founded, people = rng.randint(1100, 1800), rng.randint(3, 90) * 1000
        mill_closed = rng.randint(1950, 1995)
        facts = [
            f"{town} is a market town on the river {river}. It was first recorded in {founded} and today has about {people:,} inhabitants.",
            f"For two centuries {town} was known for its {industry} industry. The last large workshop closed in {mill_closed} and is now an arts centre.",
            f"The {town} summer fair takes place on the second weekend of July and includes a boat race on the {river}.",
        ]
        q = rng.choice([
            f"On which river is {town}?", f"When was {town} first recorded?", f"What industry was {town} known for?",
            f"When did the last large workshop in {town} close?", f"How many people live in {town}?",
            f"When does the {town} summer fair take place?",
        ])
        out.append(render(facts, q))
    for i in range(30):
        j = i % len(COMPANIES)
        company, product, founder, city = COMPANIES[j], PRODUCTS[j], rng.choice(FOUNDERS), rng.choice(HQ)
        year, staff = rng.randint(1990, 2020), rng.randint(2, 60) * 10
        facts = [
            f"{company} was founded in {year} by {founder}. The company makes {product} and is based in {city}.",
            f"{company} employs about {staff} people. Around a third of them work in research and design.",
            f"Last year {company} began selling its {product} in North America through a partner in Toronto.",
        ]
        q = rng.choice([
            f"Who founded {company}?", f"Where is {company} based?", f"What does {company} make?",
            f"How many people work for {company}?", f"In which year was {company} founded?",
            f"Where did {company} find a partner for North America?",
        ])
        out.append(render(facts, q))
    for i in range(18):
        name, (craft, work), city = ARTISTS[i % len(ARTISTS)], rng.choice(CRAFTS), rng.choice(BIRTH_CITIES)
        born, prize = rng.randint(1940, 1990), rng.randint(1995, 2022)
        facts = [
            f"The {craft} {name} was born in {city} in {born} and grew up in a family of teachers.",
            f"{name} is best known for {work}.",
            f"In {prize} {name} received a national arts prize and used the money to open a studio for young artists.",
        ]
        q = rng.choice([
            f"Where was {name} born?", f"What is {name} best known for?", f"In which year did {name} receive a national arts prize?",
            f"What did {name} do with the prize money?", f"What kind of artist is {name}?",
        ])
        out.append(render(facts, q))
    return out


def main() -> None:
    rows = []
    for kind, prompts in (
        ("multi_turn", multi_turn_prompts()),
        ("translation", translation_prompts()),
        ("summarization", summarization_prompts()),
        ("qa", qa_prompts()),
        ("math", math_prompts()),
        ("rag", rag_prompts()),
    ):
        rows += [{"kind": kind, "prompt": p} for p in dict.fromkeys(prompts)]
    rng.shuffle(rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    counts = Counter(r["kind"] for r in rows)
    print(f"wrote {len(rows)} prompts to {OUT}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
